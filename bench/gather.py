"""gather_for_metrics throughput on a large evaluation set (200k samples, 2 processes): acc vs Accelerate,
both under torchrun (so only the gathering differs), alternating."""

from __future__ import annotations

import importlib.util
import sys

from common import WORKLOADS, Result, alternate, bench_line, env_for_bench


def run(repeats: int) -> list[Result]:
    if not importlib.util.find_spec("accelerate"):
        return []
    env = env_for_bench(OMP_NUM_THREADS="1", ACC_BACKEND="ddp")

    def cmd(which: str) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(WORKLOADS / "gather_eval.py"), which]

    value, base = alternate(lambda: bench_line(cmd("acc"), env)["seconds"],
                            lambda: bench_line(cmd("accelerate"), env)["seconds"], repeats)
    return [Result("gather_for_metrics, 200k samples in batches of 1000, 2 processes", "acc", "Hugging Face Accelerate",
                   value, base, "s", repeats, "evaluation loop time on rank 0; each sample exactly once")]
