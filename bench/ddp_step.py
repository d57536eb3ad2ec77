"""Per-step time of a tiny MLP on 2 processes (gloo): acc ddp vs a hand-written DDP loop under torchrun."""

from __future__ import annotations

from common import ACC, BIN, WORKLOADS, Result, alternate, bench_line, env_for_bench


def run(repeats: int) -> list[Result]:
    env = env_for_bench(OMP_NUM_THREADS="1")  # what torchrun sets; acc sets the same share on 2 cores
    raw = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(WORKLOADS / "raw_ddp_mlp.py")]
    ours = [ACC, "launch", "--backend", "ddp", "--nproc", "2", str(WORKLOADS / "acc_mlp.py")]
    value, base = alternate(lambda: bench_line(ours, env)["per_step_s"], lambda: bench_line(raw, env)["per_step_s"],
                            repeats)
    return [Result("ddp per-step time, tiny MLP, 2 processes", "acc ddp", "torch DDP loop + torchrun", value, base,
                   "s/step", repeats, "400 timed steps after 50 warm-up, batch 32 per process")]
