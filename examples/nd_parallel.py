"""A small causal transformer trained on a device mesh: data parallel replicated and sharded, tensor parallel and
(on GPUs) context parallel, set with Accelerate's ParallelismConfig. Characters of Python's own standard-library
source are the data (no download). One command per dimension (the backend follows the config: fsdp drives every
dimension but pure replication, which ddp runs):

    acc launch --nproc 2 examples/nd_parallel.py --dp-replicate-size 2                 # DDP
    acc launch --nproc 2 examples/nd_parallel.py --dp-shard-size 2                     # FSDP
    acc launch --nproc 2 examples/nd_parallel.py --tp-size 2                           # tensor parallel
    acc launch --nproc 4 examples/nd_parallel.py --dp-shard-size 2 --tp-size 2         # TP x FSDP
    acc launch --nproc 4 examples/nd_parallel.py --dp-replicate-size 2 --dp-shard-size 2   # HSDP
    acc launch --nproc 2 examples/nd_parallel.py --dp-shard-size 1 --cp-size 2         # context parallel (CUDA only)

The model's Linears are split by a TP plan (`model.tp_plan`, acc's spelling: module-name patterns -> colwise /
rowwise); each data-parallel group reads its own batches; the loss printed is the mean over the whole global
batch. `--save DIR` writes a checkpoint at the end, which `--load DIR` resumes on any layout of the fsdp backend
(TP x FSDP -> FSDP or TP: the same losses as a run never stopped); ddp's checkpoints and fsdp's do not cross.
"""

import argparse
import os
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, ParallelismConfig, set_seed

PLAN = {"blocks.*.attn.q": "colwise", "blocks.*.attn.k": "colwise", "blocks.*.attn.v": "colwise",
        "blocks.*.attn.out": "rowwise", "blocks.*.mlp.up": "colwise", "blocks.*.mlp.down": "rowwise"}


def corpus(max_chars: int) -> str:
    """Python source files of the standard library, in a fixed order, up to `max_chars` characters."""
    parts, size = [], 0
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        parts.append(path.read_text(encoding="utf-8", errors="ignore"))
        size += len(parts[-1])
        if size >= max_chars:
            break
    return "".join(parts)[:max_chars]


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(width, width) for _ in range(4))
        self.head_dim = width // heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # under tp, q/k/v give this process's heads only: -1 below counts them
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(width), Attention(width, heads)
        self.norm2, self.mlp = nn.LayerNorm(width), MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CausalLM(nn.Module):
    def __init__(self, vocab: int, context: int, width: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)
        self.tp_plan = PLAN

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean next-character loss (the model returns it, as transformers' models do given labels)."""
        h = self.embed(x) + self.position[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main() -> None:
    p = argparse.ArgumentParser()
    for dim in ("dp-replicate", "dp-shard", "tp", "cp"):
        p.add_argument(f"--{dim}-size", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16, help="the global batch, over all data-parallel groups")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--save")
    p.add_argument("--load")
    args = p.parse_args()

    config = ParallelismConfig(dp_replicate_size=args.dp_replicate_size, dp_shard_size=args.dp_shard_size,
                               tp_size=args.tp_size, cp_size=args.cp_size)
    # acc's own semantics: the shuffled order depends only on the seed and the epoch, so every layout of the same
    # global batch trains on the same batches (under Accelerate's, a layout with one data-parallel group, tp alone,
    # shuffles from another generator)
    accelerator = Accelerator(parallelism_config=config, semantics="acc")
    set_seed(0)
    text = corpus(200_000)
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text[: 60_000]])
    count = (len(ids) - 1) // args.context
    data = TensorDataset(ids[: count * args.context].view(count, args.context),
                         ids[1: count * args.context + 1].view(count, args.context))
    dp = config.dp_replicate_size * config.dp_shard_size  # the groups that read different batches
    loader = DataLoader(data, batch_size=args.batch_size // dp, shuffle=True, drop_last=True)
    model = CausalLM(len(vocab), args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if args.load:
        accelerator.load_state(args.load)
    mesh = accelerator.torch_device_mesh
    accelerator.print(f"mesh: {dict(zip(mesh.mesh_dim_names, mesh.mesh.shape)) if mesh is not None else 'none'}, "
                      f"backend {accelerator.backend}, {accelerator.num_processes} processes")
    step = 0
    while step < args.steps:
        for x, y in loader:
            # context parallel splits the sequence of these buffers over the cp dim (nothing without one)
            with accelerator.maybe_context_parallel(buffers=[x, y], buffer_seq_dims=[1, 1], no_restore_buffers={x, y}):
                loss = model(x, y)
                accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            mean = accelerator.reduce(loss.detach(), "mean").item()  # over every data-parallel group
            if step == 1 or step % 10 == 0 or step == args.steps:
                accelerator.print(f"step {step}: train loss {mean:.4f}")
            if step == args.steps:
                break
    if args.save:
        accelerator.save_state(args.save)
    accelerator.end_training()


if __name__ == "__main__":
    main()
