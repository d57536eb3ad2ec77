"""torch.compile (inductor) vs eager step time on CPU for a small transformer block (one process, cpu backend).

Each launch warms up for 5 steps (the compiling happens there) and times the next 30: the step rows are warm
steps only, with inductor's caches in a directory of this run's own (warm after the first round); the warm-up's
own time with the caches off (compiling included, one launch) is a row of its own. Inductor is measured twice:
with its own random numbers (compile_random inductor, the default and Accelerate's) and with torch's
(--compile-random eager: the uncompiled model's dropout masks). The three configurations run in turns, the order
rotated each round. The same workload as precision_step, in fp32.
"""

from __future__ import annotations

import statistics
import tempfile

from common import ACC, WORKLOADS, Result, bench_line, env_for_bench

WORKLOAD = "d_model 256, 4 heads, ff 1024, dropout 0.1, batch 16 x 64 tokens, AdamW, fp32"
CONFIGS = {"eager": ["--dynamo-backend", "no"],
           "inductor": ["--dynamo-backend", "inductor"],
           "inductor, eager random": ["--dynamo-backend", "inductor", "--compile-random", "eager"]}


def run(repeats: int) -> list[Result]:
    script = str(WORKLOADS / "transformer_step.py")
    with tempfile.TemporaryDirectory(prefix="acc-bench-inductor-") as cache:
        env = env_for_bench(TORCHINDUCTOR_CACHE_DIR=cache)  # this run's own compiler cache, warm after round 1
        step: dict[str, list[float]] = {name: [] for name in CONFIGS}
        names = list(CONFIGS)
        for round_ in range(repeats):
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                step[name].append(launch(script, name, env)["per_step_s"])
        cold = {name: launch(script, name, {**env, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})["warmup_s"]
                for name in ("eager", "inductor")}
    med = {name: statistics.median(values) for name, values in step.items()}
    title = "transformer block step time on CPU (warm steps)"
    return [
        Result(title, "torch.compile (inductor)", "eager", med["inductor"], med["eager"], "s/step", repeats,
               WORKLOAD + "; inductor's random numbers (the default, Accelerate's)"),
        Result(title, "torch.compile (inductor, --compile-random eager)", "eager", med["inductor, eager random"],
               med["eager"], "s/step", repeats, WORKLOAD + "; dropout drawn by torch's generator, the eager masks"),
        Result(title, "torch.compile (inductor, --compile-random eager)", "torch.compile (inductor)",
               med["inductor, eager random"], med["inductor"], "s/step", repeats, WORKLOAD),
        Result("transformer block warm-up (5 steps, compiling included, inductor's caches off)",
               "torch.compile (inductor)", "eager", cold["inductor"], cold["eager"], "s", 1, WORKLOAD),
    ]


def launch(script: str, name: str, env: dict) -> dict:
    line = bench_line([ACC, "launch", "--cpu", *CONFIGS[name], script], env)
    if line["compiled"] != (name != "eager"):
        raise RuntimeError(f"{name}: the model was {'not ' if line['compiled'] else ''}compiled")
    return line
