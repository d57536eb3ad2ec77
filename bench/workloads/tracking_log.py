"""accelerator.log of 10 scalars per step on the built-in jsonl tracker, against a ~2 ms training step (a small MLP,
one process, cpu backend): the log call alone (mean of 5000 calls and the writing of their lines), and steps with
and without a log call alternating step by step (means); prints medians over the repeats as one BENCH line.

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

    def step() -> float:
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    def steps() -> tuple[float, float]:
        """Mean time of a step without and of a step with a log call (its writes included), the two alternating
        step by step."""
        plain, logged = [], []
        for i in range(2 * STEPS):
            start = time.perf_counter()
            loss = step()
            if i % 2:
                counter["step"] += 1
                accelerator.log(values(loss), step=counter["step"])
                logged.append(time.perf_counter() - start)
            else:
                plain.append(time.perf_counter() - start)
        return statistics.mean(plain), statistics.mean(logged)

    def logs() -> float:
        tracker = accelerator.get_tracker("jsonl")
        tracker.flush()
        start = time.perf_counter()
        for i in range(LOGS):
            counter["step"] += 1
            accelerator.log(values(0.25), step=counter["step"])
        tracker.flush()  # the lines written to the file, inside the measured time
        return (time.perf_counter() - start) / LOGS

    steps()  # warm-up
    times = {"step": [], "step_with_log": [], "log": []}
    for _ in range(repeats):
        plain, logged = steps()
        times["step"].append(plain)
        times["step_with_log"].append(logged)
        times["log"].append(logs())
    accelerator.end_training()
    import shutil

    shutil.rmtree(project, ignore_errors=True)
    print("BENCH " + json.dumps({k: statistics.median(v) for k, v in times.items()}))


if __name__ == "__main__":
    main()
