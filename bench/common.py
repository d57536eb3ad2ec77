"""Helpers for benchmarks: alternate contender and baseline in the same run, report medians and ratios."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
PEER_BIN = Path(sys.executable).parent  # .venv-bench/bin: accelerate, lightning
BIN = ROOT / ".venv" / "bin" if (ROOT / ".venv" / "bin" / "acc").exists() else PEER_BIN  # acc, torchrun
ACC = str(BIN / "acc")
WORKLOADS = ROOT / "bench" / "workloads"


MEASURED: dict[str, dict] = {}  # figures one benchmark leaves for a later one in the same run (scaling)


@dataclass
class Result:
    """One comparison: `ratio` = contender / baseline (below 1 means the contender is faster or smaller)."""

    benchmark: str
    contender: str
    baseline: str
    value: float
    baseline_value: float
    unit: str
    repeats: int
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.value / self.baseline_value

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": round(self.ratio, 3)}


def alternate(contender: Callable[[], float], baseline: Callable[[], float], repeats: int) -> tuple[float, float]:
    """Run baseline and contender in turns (B A B A ...), `repeats` times each; return their medians."""
    a, b = [], []
    for _ in range(repeats):
        b.append(baseline())
        a.append(contender())
    return statistics.median(a), statistics.median(b)


def wall(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> float:
    """Wall-clock seconds of a command that must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def bench_line(cmd: list[str], env: dict | None = None) -> dict:
    """Run a workload and return the JSON it printed after 'BENCH '."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    raise RuntimeError(f"{' '.join(cmd)} printed no BENCH line ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def env_for_bench(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACC_")}
    env["ACC_OUTPUT_DIR"] = ""  # benchmark launches record no run manifests in the checkout
    env.update(extra)
    return env


def machine() -> dict:
    import torch

    from acc import __version__

    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "acc": __version__,
    }
