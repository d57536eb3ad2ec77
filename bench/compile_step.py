"""torch.compile (inductor) vs eager step time on CPU for a small transformer block (one process, cpu backend).

The workload warms up for 5 steps (the compiling happens there) and times the next 30; compile time is not in
the figure. The same workload as precision_step, in fp32.
"""

from __future__ import annotations

from common import ACC, WORKLOADS, Result, alternate, bench_line, env_for_bench


def run(repeats: int) -> list[Result]:
    env = env_for_bench()
    script = str(WORKLOADS / "transformer_step.py")

    def step(dynamo: str) -> float:
        line = bench_line([ACC, "launch", "--cpu", "--dynamo-backend", dynamo, script], env)
        if line["compiled"] != (dynamo != "no"):
            raise RuntimeError(f"--dynamo-backend {dynamo}: the model was {'not ' if line['compiled'] else ''}compiled")
        return line["per_step_s"]

    value, base = alternate(lambda: step("inductor"), lambda: step("no"), repeats)
    return [Result("transformer block step time on CPU", "torch.compile (inductor)", "eager", value, base, "s/step",
                   repeats, "d_model 256, 4 heads, ff 1024, batch 16 x 64 tokens, AdamW, fp32; compiling in warm-up")]
