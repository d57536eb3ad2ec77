"""The checkpoint workload shared by acc's and Accelerate's runs: a ~105 MB model with its AdamW state, and the
loop that times a library's save_state/load_state against torch.save/torch.load of the same state dicts,
alternating in one process; prints medians as one BENCH line."""

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(*[nn.Linear(2560, 2560) for _ in range(4)])  # 26.2 M params = 105 MB fp32
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def first_step(model: nn.Module, opt: Any) -> None:
    model(torch.randn(2, 2560)).sum().backward()
    opt.step()  # optimizer state exists (2 more tensors per parameter)


def time_against_torch(model: nn.Module, opt: Any, save: Callable[[Path], None], load: Callable[[Path], None],
                       repeats: int, prefix: str) -> None:
    """Alternate torch.save / save(dir) / torch.load / load(dir) `repeats` times in a fresh directory here."""
    root = Path(tempfile.mkdtemp(dir="."))
    times: dict[str, list[float]] = {f"{prefix}_save": [], "torch_save": [], f"{prefix}_load": [], "torch_load": []}
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, root / "plain.pt")
            times["torch_save"].append(time.perf_counter() - start)
            start = time.perf_counter()
            save(root / "ckpt")
            times[f"{prefix}_save"].append(time.perf_counter() - start)
            start = time.perf_counter()
            state = torch.load(root / "plain.pt", weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            times["torch_load"].append(time.perf_counter() - start)
            start = time.perf_counter()
            load(root / "ckpt")
            times[f"{prefix}_load"].append(time.perf_counter() - start)
    finally:
        shutil.rmtree(root)
    params_mb = sum(p.numel() * 4 for p in model.parameters()) / 1e6
    print("BENCH " + json.dumps({k: statistics.median(v) for k, v in times.items()} | {"params_mb": params_mb}))
