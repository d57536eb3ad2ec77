"""Pipeline-parallel inference (Accelerate's `accelerate.inference.prepare_pippy`; Accelerate's own script runs
GPT-2 and BERT from the Hub): here small models built locally, no download.

    acc launch --backend ddp --nproc 2 PATH/test_pippy.py

For each model: split with "auto" and with explicit split points, the last process's output equals the unsplit
model's on the same batch (padded rows aside); with `gather_output` every process has it. Exits 0 when every check
passed, 1 otherwise (each failure printed).
"""

from __future__ import annotations

import sys

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(self.norm(x)))


class Stack(nn.Module):
    def __init__(self, width: int = 16, blocks: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def check(name: str, split_points: object, gather: bool, batch: int, failures: list[str]) -> None:
    from acc import PartialState
    from acc.inference import prepare_pippy

    state = PartialState()
    torch.manual_seed(0)
    model = Stack().eval()
    inputs = torch.randn(batch, 5, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(inputs)
    chunks = state.num_processes
    micro = -(-batch // chunks)
    model = prepare_pippy(model, split_points=split_points, no_split_module_classes=["Block"],
                          example_args=(inputs[:micro],), gather_output=gather)
    with torch.no_grad():
        got = model(inputs)
    last = state.process_index == state.num_processes - 1
    if got is None:
        if gather or last:
            failures.append(f"{name}: process {state.process_index} got no output")
        return
    if not gather and not last:
        failures.append(f"{name}: process {state.process_index} got an output without gather_output")
        return
    diff = float((got[:batch] - want).abs().max())
    print(f"test_pippy {name}: process {state.process_index}: max |difference| {diff:.2e} "
          f"(split at {model.hf_split_points})")
    if diff > 1e-6:
        failures.append(f"{name}: output differs from the unsplit model's by {diff}")


def main() -> int:
    from acc import PartialState

    state = PartialState()
    failures: list[str] = []
    check("auto", "auto", False, 4, failures)
    check("explicit, gathered", [f"blocks.{i}" for i in range(1, state.num_processes)], True, 4, failures)
    check("a batch padded to the micro-batches", "auto", True, 3, failures)
    for failure in failures:
        print(f"test_pippy: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
