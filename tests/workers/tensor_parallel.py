"""Training on a ParallelismConfig mesh (tensor parallel, TP x FSDP, HSDP, HSDP x TP) with real processes: a small
residual MLP stack whose `up`/`down` Linears follow a TP plan, AdamW and gradient clipping, a fixed global batch
of GLOBAL rows per step (each data-parallel rank reads GLOBAL / dp of them). Rank 0 writes the full weights
after the last step to OUT/weights.pt; every rank writes the batches it saw and the clipped norms.

    acc launch --backend fsdp --nproc 4 tensor_parallel.py --out DIR --sizes tp=2 dp_shard=2 --steps 3
    ... --first 2 --steps 2 --save CKPT     (steps 2-3, state saved after them)
    ... --first 4 --steps 2 --load CKPT     (load, then steps 4-5)

`build()` and `reference()` are the single-process model and loop the test compares with.
"""

import argparse
import os
import warnings

import torch
from common import dump
from torch import nn

DIM, HIDDEN, SEQ, GLOBAL, LR, MAX_NORM, MAX_STEPS = 16, 32, 4, 8, 1e-2, 0.5, 8
PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).sum(-1)  # (not a view: FSDP2 warns of a root module returning one)


def build() -> Net:
    torch.manual_seed(0)
    return Net()


def data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `steps` global batches of one fixed stream (at most MAX_STEPS)."""
    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(MAX_STEPS * GLOBAL, SEQ, DIM, generator=g), torch.randn(MAX_STEPS * GLOBAL, SEQ, generator=g)
    return xs[:steps * GLOBAL], ys[:steps * GLOBAL]


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def reference(steps: int) -> tuple[dict, list[float]]:
    """The single-process run: its weights after `steps` steps and its clipped norms."""
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    xs, ys = data(steps)
    norms = []
    for s in range(steps):
        loss_of(model, xs[s * GLOBAL:(s + 1) * GLOBAL], ys[s * GLOBAL:(s + 1) * GLOBAL]).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, norms


def main() -> None:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from acc import Accelerator, ParallelismConfig

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", nargs="*", default=[], help="DIM=SIZE, e.g. tp=2 dp_shard=2")
    p.add_argument("--first", type=int, default=0, help="the first step's index (its rows of the data)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--save")
    p.add_argument("--load")
    args = p.parse_args()
    warnings.filterwarnings("ignore", message="Slicing a flattened dim")
    sizes = {f"{k}_size": int(v) for k, v in (item.split("=") for item in args.sizes)}
    accelerator = Accelerator(parallelism_config=ParallelismConfig(**sizes) if sizes else None)
    dp = accelerator.num_processes // (sizes.get("tp_size", 1))
    model = build()
    model.tp_plan = PLAN
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    xs, ys = data(args.first + args.steps)
    rows = slice(args.first * GLOBAL, None)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs[rows], ys[rows]), batch_size=GLOBAL // dp)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    if args.load:
        accelerator.load_state(args.load)
    seen, norms, losses = [], [], []
    for x, y in loader:
        seen.append(round(float(x.sum()), 4))
        loss = loss_of(model, x, y)
        accelerator.backward(loss)
        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if args.save:
        accelerator.save_state(args.save)
    # evaluation: 11 rows, each seen once through gather_for_metrics (tensors and objects)
    rows = accelerator.prepare(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(11)), batch_size=2))
    evaluated, objects = [], []
    for (batch,) in rows:
        evaluated += accelerator.gather_for_metrics(batch).tolist()
        objects += accelerator.gather_for_metrics([f"row {i}" for i in batch.tolist()], use_gather_object=True)
    # reduce: "sum" counts each tp group once (its ranks read the same batches); "mean" and "max" as over dp
    reduced = {how: accelerator.reduce(torch.tensor([sum(seen), 1.0], dtype=torch.float64), how).tolist()
               for how in ("sum", "mean", "max")}
    state = accelerator.get_state_dict(model)
    os.makedirs(args.out, exist_ok=True)
    if accelerator.is_main_process:
        torch.save({k: v.detach().cpu() for k, v in state.items()}, os.path.join(args.out, "weights.pt"))
    mesh = accelerator.torch_device_mesh
    dump(args.out, accelerator.process_index, {
        "seen": seen, "norms": norms, "losses": losses, "evaluated": evaluated, "objects": objects, "reduced": reduced,
        "mesh": list(mesh.mesh_dim_names) if mesh is not None else None,
        "coordinate": mesh.get_coordinate() if mesh is not None else None,
        "dtensor_params": sorted(n for n, q in model.named_parameters() if isinstance(q, DTensor)),
        "fsdp_units": sorted(n or "<root>" for n, m in model.named_modules() if isinstance(m, FSDPModule)),
    })
    accelerator.end_training()


if __name__ == "__main__":
    main()
