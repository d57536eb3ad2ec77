"""The shared tiny-MLP workload: same data, model, batch and step count for every contender."""

import json
import os
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

SAMPLES, FEATURES, BATCH = 8192, 32, 32
WARMUP, STEPS = 100, 1500


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(SAMPLES, FEATURES, generator=g), torch.randn(SAMPLES, 1, generator=g))


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


class StepTimer:
    """Times steps WARMUP..WARMUP+STEPS; reports seconds per step on rank 0 as one JSON line."""

    def __init__(self) -> None:
        self.count = 0
        self.start = 0.0

    def tick(self) -> bool:
        """Call once per finished step; returns False when enough steps were timed."""
        self.count += 1
        if self.count == WARMUP:
            self.start = time.perf_counter()
        if self.count == WARMUP + STEPS:
            per_step = (time.perf_counter() - self.start) / STEPS
            if int(os.environ.get("RANK", "0")) == 0:
                print("BENCH " + json.dumps({"per_step_s": per_step}), flush=True)
            return False
        return True
