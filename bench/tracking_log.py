"""accelerator.log of 10 scalars per step on the built-in jsonl tracker vs a ~2 ms training step (one process)."""

from __future__ import annotations

import sys

from common import WORKLOADS, Result, bench_line, env_for_bench


def run(repeats: int) -> list[Result]:
    out = bench_line([sys.executable, str(WORKLOADS / "tracking_log.py"), str(repeats)],
                     env_for_bench(OMP_NUM_THREADS="1"))
    note = ("10 Python floats per call, one JSON line each (written every 0.25 s, the encoding included); the step "
            "is a 3-layer MLP (256-512-512-10, batch 32, AdamW) on one thread; steps with and without a log call "
            "alternate step by step (per-step means)")
    return [
        Result("accelerator.log, 10 scalars, jsonl tracker", "one log call", "one ~2 ms training step", out["log"],
               out["step"], "s", repeats, note),
        Result("training step with accelerator.log of 10 scalars (jsonl)", "step + log", "step", out["step_with_log"],
               out["step"], "s/step", repeats, note),
    ]
