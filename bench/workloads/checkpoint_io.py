"""save_state/load_state of a ~100 MB model (+ AdamW state) vs torch.save/torch.load of the same state
dicts, alternating in one process; prints medians as one BENCH line."""

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from acc import Accelerator


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    accelerator = Accelerator()
    model = nn.Sequential(*[nn.Linear(2560, 2560) for _ in range(4)])  # 26.2 M params = 105 MB fp32
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    model(torch.randn(2, 2560)).sum().backward()
    opt.step()  # optimizer state exists (2 more tensors per parameter)
    root = Path(tempfile.mkdtemp(dir="."))
    times = {"acc_save": [], "torch_save": [], "acc_load": [], "torch_load": []}
    try:
        for i in range(repeats):
            start = time.perf_counter()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, root / "plain.pt")
            times["torch_save"].append(time.perf_counter() - start)
            start = time.perf_counter()
            accelerator.save_state(root / "ckpt")
            times["acc_save"].append(time.perf_counter() - start)
            start = time.perf_counter()
            state = torch.load(root / "plain.pt", weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            times["torch_load"].append(time.perf_counter() - start)
            start = time.perf_counter()
            accelerator.load_state(root / "ckpt")
            times["acc_load"].append(time.perf_counter() - start)
    finally:
        shutil.rmtree(root)
    params_mb = sum(p.numel() * 4 for p in model.parameters()) / 1e6
    print("BENCH " + json.dumps({k: statistics.median(v) for k, v in times.items()} | {"params_mb": params_mb}))


if __name__ == "__main__":
    main()
