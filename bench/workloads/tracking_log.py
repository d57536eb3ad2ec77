"""accelerator.log of 10 scalars per step on the built-in jsonl tracker, against a ~2 ms training step (a small MLP,
one process, cpu backend), in one process, alternating; prints medians as one BENCH line.

    python tracking_log.py REPEATS
"""

import json
import statistics
import sys
import tempfile
import time

import torch
from torch import nn

from acc import Accelerator

STEPS = 500
LOGS = 5000


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.set_num_threads(1)
    project = tempfile.mkdtemp(dir=".")
    accelerator = Accelerator(log_with="jsonl", project_dir=project)
    accelerator.init_trackers("bench", config={"steps": STEPS})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    counter = {"step": 0}

    def values(loss: float) -> dict:
        return {"loss": loss, "lr": 1e-3, "grad_norm": 0.5, "epoch": 1.0, "tokens": 4096.0, "accuracy": 0.9,
                "throughput": 1234.5, "loss_scale": 1.0, "memory_mb": 512.0, "step_time": 0.002}

    def steps(log: bool) -> float:
        start = time.perf_counter()
        for _ in range(STEPS):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if log:
                counter["step"] += 1
                accelerator.log(values(loss.item()), step=counter["step"])
            else:
                loss.item()  # the same synchronisation as the logging loop
        return (time.perf_counter() - start) / STEPS

    def logs() -> float:
        start = time.perf_counter()
        for i in range(LOGS):
            counter["step"] += 1
            accelerator.log(values(0.25), step=counter["step"])
        return (time.perf_counter() - start) / LOGS

    steps(False)  # warm-up
    times = {"step": [], "step_with_log": [], "log": []}
    for _ in range(repeats):
        times["step"].append(steps(False))
        times["step_with_log"].append(steps(True))
        times["log"].append(logs())
    accelerator.end_training()
    import shutil

    shutil.rmtree(project, ignore_errors=True)
    print("BENCH " + json.dumps({k: statistics.median(v) for k, v in times.items()}))


if __name__ == "__main__":
    main()
