"""A 3-layer model trained with Adam on fixed data; works unchanged on cpu, ddp, fsdp and deepspeed.

    acc launch ... layers.py --out DIR --steps 20 [--save CKPT] [--load CKPT] [--eval-only] [--save-model DIR]
Each rank writes losses, its local parameter count, the total count, the classes fully_shard made units of, and
(with --eval-only) an eval loss. `--no-split Block` gives the model `_no_split_modules = ["Block"]` (as transformers'
models name their layers).
"""

import argparse

import torch
from common import dump
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, TorchDynamoPlugin, set_seed


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.linear(x))


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), Block(32), Block(32), nn.Linear(32, 4))


def local_numel(p: torch.Tensor) -> int:
    """Elements this process stores: a DTensor's local shard (fsdp), a ZeRO-3 partition, else everything."""
    if hasattr(p, "to_local"):
        return p.to_local().numel()
    if hasattr(p, "ds_tensor"):
        return p.ds_tensor.numel()
    return p.numel()


def zero3_masters(opt) -> list[bool]:
    """Under ZeRO-3, for each optimizer sub-group: does its fp32 master share the parameter partition's memory?"""
    inner = getattr(opt, "optimizer", None)
    masters, parts = getattr(inner, "fp32_partitioned_groups_flat", []), getattr(inner, "fp16_partitioned_groups_flat", [])
    return [m.untyped_storage().data_ptr() == p.untyped_storage().data_ptr() for m, p in zip(masters, parts)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--save")
    p.add_argument("--load")
    p.add_argument("--eval-only", action="store_true")
    p.add_argument("--save-model")
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--regional", action="store_true", help="TorchDynamoPlugin(use_regional_compilation=True)")
    p.add_argument("--no-split", nargs="*", help="the model's _no_split_modules")
    args = p.parse_args()

    accelerator = Accelerator(dynamo_plugin=TorchDynamoPlugin(use_regional_compilation=True) if args.regional else None)
    set_seed(0)
    g = torch.Generator().manual_seed(11)
    data = TensorDataset(torch.randn(96, 16, generator=g), torch.randn(96, 4, generator=g))
    evaluation = TensorDataset(torch.randn(40, 16, generator=g), torch.randn(40, 4, generator=g))
    model = build()
    if args.no_split is not None:
        model._no_split_modules = args.no_split
    total = sum(p.numel() for p in model.parameters())
    opt = (torch.optim.Adam(model.parameters(), lr=0.01) if args.optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.05))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True)
    eval_loader = DataLoader(evaluation, batch_size=4)
    model, opt, loader, eval_loader = accelerator.prepare(model, opt, loader, eval_loader)
    if args.load:
        accelerator.load_state(args.load)
    losses = []
    while not args.eval_only and len(losses) < args.steps:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
            if len(losses) == args.steps:
                break
    if args.save:
        accelerator.save_state(args.save)
    with torch.no_grad():
        errors = [accelerator.gather_for_metrics(((model(x) - y) ** 2).mean(dim=1)) for x, y in eval_loader]
    eval_loss = torch.cat(errors).mean().item()
    if args.save_model:
        accelerator.save_model(model, args.save_model)
    dump(args.out, accelerator.process_index, {
        "losses": losses, "eval_loss": eval_loss, "total_params": total,
        "local_params": sum(local_numel(p) for p in model.parameters()), "world": accelerator.num_processes,
        "distributed_type": accelerator.distributed_type,
        # torch.compile: the modules compiled in place (nn.Module.compile), and whether the whole model was compiled
        "compiled_modules": [type(m).__name__ for _, m in model.named_modules()
                             if getattr(m, "_compiled_call_impl", None) is not None],
        "compiled_whole": hasattr(model, "_orig_mod"),
        "zero3_masters": zero3_masters(opt),
        "fsdp_units": [type(m).__name__ for m in model.modules() if m is not model and type(m).__name__.startswith("FSDP")],
    })
    accelerator.end_training()


if __name__ == "__main__":
    main()
