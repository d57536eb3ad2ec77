"""Per-step time of a tiny MLP on 2 processes (gloo): acc ddp, Hugging Face Accelerate and Lightning Fabric,
each against a hand-written torch DDP loop under torchrun, all of them in turn in every round of the same run."""

from __future__ import annotations

import importlib.util
import statistics
import sys

from common import ACC, WORKLOADS, Result, bench_line, env_for_bench


def _torchrun(script: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(WORKLOADS / script)]


def run(repeats: int) -> list[Result]:
    env = env_for_bench(OMP_NUM_THREADS="1")  # what torchrun sets; acc sets the same share on 2 cores
    raw = _torchrun("raw_ddp_mlp.py")
    acc = [ACC, "launch", "--output-dir", "", "--backend", "ddp", "--nproc", "2"]
    # forked workers (the default) and spawned ones: both shown. Runs minutes apart differ by 10-20% on this
    # machine, in either direction; forked workers take ~0.2 more minor page faults per step (under 1 us)
    contenders = {"acc ddp (acc launch)": [*acc, str(WORKLOADS / "acc_mlp.py")],
                  "acc ddp (acc launch --start-method spawn)": [*acc, "--start-method", "spawn",
                                                                str(WORKLOADS / "acc_mlp.py")],
                  # the hand-written loop itself under acc launch: what the launch environment costs, apart from
                  # acc's loop
                  "torch DDP loop (acc launch)": [*acc, str(WORKLOADS / "raw_ddp_mlp.py")]}
    if importlib.util.find_spec("accelerate"):
        contenders["Hugging Face Accelerate (torchrun)"] = _torchrun("accelerate_mlp.py")
    if importlib.util.find_spec("lightning"):
        contenders["Lightning Fabric (torchrun)"] = _torchrun("fabric_mlp.py")
    # one round runs the baseline and every contender once, each round in an order rotated by one (so no contender
    # always runs right after the same one, or first); the medians over the rounds are compared, so each ratio is
    # taken against the same baseline runs, interleaved with the contender's own
    commands = {"baseline": raw, **contenders}
    order = list(commands)
    times: dict[str, list[float]] = {label: [] for label in order}
    for round_ in range(repeats):
        for label in order[round_ % len(order):] + order[:round_ % len(order)]:
            times[label].append(bench_line(commands[label], env)["per_step_s"])
    base = statistics.median(times["baseline"])
    note = ("1500 timed steps after 100 warm-up (mlp_common.py), batch 32 per process; every contender and the "
            f"baseline once per round, in an order rotated each round, {repeats} rounds")
    return [Result("per-step time, tiny MLP, 2 processes", label, "torch DDP loop + torchrun",
                   statistics.median(times[label]), base, "s/step", repeats, note) for label in contenders]
