"""A small model built one of several ways, then trained a few steps; works unchanged on cpu, ddp, fsdp, deepspeed.

    acc launch ... built_sharded.py --out DIR [--build normal|init_module|empty_init|init_empty_weights|rank0]
        [--load FILE.safetensors] [--steps N] [--weights FILE.safetensors] [--grads] [--gathers]

--build: normal (no context), init_module (`accelerator.init_module()`), empty_init (`init_module(empty_init=True)`),
init_empty_weights (Accelerate's `acc.init_empty_weights()`), rank0 (real on process 0, meta elsewhere: with
fsdp_from_rank0). --load reads pretrained weights with acc.load_checkpoint_in_model before prepare (and
counts the checkpoint bytes this process read). Each rank writes its losses, the random numbers drawn right after
building (the random stream), the local parameter count and bytes read; --weights: the main process saves the full
weights right after prepare (before training); --grads: the whole gradients of the first step; --gathers (fsdp with
the p2p all-gather): the first backward's events in order, "gather" for each all-gather and "block N" as block N's
backward starts.
"""

import argparse
import contextlib

import torch
from common import dump
from layers import local_numel
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import acc
from acc import Accelerator, set_seed
from acc.big_model import files


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return torch.tanh(self.norm(self.linear(x)))


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), Block(32), Block(32), nn.Linear(32, 4))


def record_gathers(model: nn.Module, events: list[str]) -> None:
    """Append "gather" to `events` at each all-gather (acc's p2p one, as fsdp runs it on gloo) and "block N" as the
    backward of block N's linear layer starts."""
    from acc import backend as sdk

    original = sdk.p2p_all_gather_into

    def gather(*args, **kwargs):
        events.append("gather")
        return original(*args, **kwargs)

    sdk.p2p_all_gather_into = gather
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for i, block in enumerate(blocks):
        block.linear.register_full_backward_pre_hook(lambda *_, i=i: events.append(f"block {i}"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--build", default="normal",
                   choices=["normal", "init_module", "empty_init", "init_empty_weights", "rank0"])
    p.add_argument("--load")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--weights")
    p.add_argument("--grads", action="store_true", help="record the whole gradients of the first step (not deepspeed)")
    p.add_argument("--gathers", action="store_true", help="record the first backward's all-gathers (fsdp, p2p)")
    args = p.parse_args()

    accelerator = Accelerator()
    set_seed(0)
    context = {
        "normal": contextlib.nullcontext(),
        "init_module": accelerator.init_module(),
        "empty_init": accelerator.init_module(empty_init=True),
        "init_empty_weights": acc.init_empty_weights(),
        "rank0": contextlib.nullcontext() if accelerator.is_main_process else acc.init_empty_weights(),
    }[args.build]
    with context:
        model = build()
    stream = torch.rand(4).tolist()  # what the script draws next: equal to a normal build's when the stream continues
    read = [0]
    if args.load:
        original = files.TensorRecord._bytes

        def counted(self, offset, nbytes):
            read[0] += nbytes
            return original(self, offset, nbytes)

        files.TensorRecord._bytes = counted
        acc.load_checkpoint_in_model(model, args.load)
        files.TensorRecord._bytes = original
    g = torch.Generator().manual_seed(11)
    data = TensorDataset(torch.randn(48, 16, generator=g), torch.randn(48, 4, generator=g))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    if args.weights:
        state = accelerator.get_state_dict(model)
        if accelerator.is_main_process:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in state.items()}, args.weights)
    losses, grads, events, first_backward = [], [], [], []
    if args.gathers:
        record_gathers(model, events)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        events.clear()
        accelerator.backward(loss)
        if not losses:
            first_backward = list(events)
        if args.grads and not grads:
            grads = torch.cat([(q.grad.full_tensor() if hasattr(q.grad, "full_tensor") else q.grad).flatten()
                               for q in model.parameters()]).tolist()
        opt.step()
        opt.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
        if len(losses) == args.steps:
            break
    dump(args.out, accelerator.process_index, {
        "losses": losses, "grads": grads, "stream": stream, "backward_events": first_backward,
        "bytes_read": read[0],
        "local_params": sum(local_numel(q) for q in model.parameters()),
        "total_params": sum(q.numel() for q in build().parameters()),
    })
    accelerator.end_training()


if __name__ == "__main__":
    main()
