"""The model and checkpoint of the big-model benchmark: 18 blocks of 2048 -> 4096 -> 2048, 1.21 GB of float32.

    python big_model_common.py DIR     writes DIR/model-0000i-of-00019.safetensors + model.safetensors.index.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

BUDGET = "400MB"


class Block(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class BigNet(nn.Module):
    def __init__(self, n: int = 18, d: int = 2048, h: int = 4096):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n))
        self.head = nn.Linear(d, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def example_input() -> torch.Tensor:
    return torch.randn(4, 2048, generator=torch.Generator().manual_seed(123))


def write_checkpoint(directory: Path) -> int:
    """One shard per block (written one at a time) and the index; returns the total bytes."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in BigNet().state_dict().items()}
    groups: dict[str, dict[str, torch.Size]] = {}
    for name, shape in shapes.items():
        groups.setdefault(".".join(name.split(".")[:2]) if name.startswith("blocks.") else "head", {})[name] = shape
    weight_map, total = {}, 0
    for i, members in enumerate(groups.values()):
        generator = torch.Generator().manual_seed(i)
        shard = {name: torch.empty(shape).uniform_(-0.03, 0.03, generator=generator) for name, shape in members.items()}
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(shard, directory / file)
        weight_map.update(dict.fromkeys(shard, file))
        total += sum(t.numel() * t.element_size() for t in shard.values())
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total


if __name__ == "__main__":
    print(write_checkpoint(Path(sys.argv[1])))
