"""bf16 vs fp32 step time on CPU for a small transformer block (one process, cpu backend)."""

from __future__ import annotations

from common import ACC, WORKLOADS, Result, alternate, bench_line, env_for_bench


def run(repeats: int) -> list[Result]:
    env = env_for_bench()
    script = str(WORKLOADS / "transformer_step.py")

    def step(mode: str) -> float:
        return bench_line([ACC, "launch", "--cpu", "--mixed-precision", mode, script], env)["per_step_s"]

    value, base = alternate(lambda: step("bf16"), lambda: step("no"), repeats)
    return [Result("transformer block step time on CPU", "bf16 autocast", "fp32", value, base, "s/step", repeats,
                   "d_model 256, 4 heads, ff 1024, batch 16 x 64 tokens, AdamW")]
