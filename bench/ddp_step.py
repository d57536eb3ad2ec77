"""Per-step time of a tiny MLP on 2 processes (gloo): acc ddp, Hugging Face Accelerate and Lightning Fabric,
each against a hand-written torch DDP loop under torchrun, alternating in the same run."""

from __future__ import annotations

import importlib.util
import sys

from common import ACC, WORKLOADS, Result, alternate, bench_line, env_for_bench


def _torchrun(script: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(WORKLOADS / script)]


def run(repeats: int) -> list[Result]:
    env = env_for_bench(OMP_NUM_THREADS="1")  # what torchrun sets; acc sets the same share on 2 cores
    raw = _torchrun("raw_ddp_mlp.py")
    acc = [ACC, "launch", "--output-dir", "", "--backend", "ddp", "--nproc", "2"]
    # forked workers (the default) run a ~2 ms step a few tens of microseconds slower than spawned ones (more page
    # faults and system time per step; cause not pinned down; no difference measured on a 13 ms step): both shown
    contenders = {"acc ddp (acc launch)": [*acc, str(WORKLOADS / "acc_mlp.py")],
                  "acc ddp (acc launch --start-method spawn)": [*acc, "--start-method", "spawn",
                                                                str(WORKLOADS / "acc_mlp.py")]}
    if importlib.util.find_spec("accelerate"):
        contenders["Hugging Face Accelerate (torchrun)"] = _torchrun("accelerate_mlp.py")
    if importlib.util.find_spec("lightning"):
        contenders["Lightning Fabric (torchrun)"] = _torchrun("fabric_mlp.py")
    results = []
    for label, cmd in contenders.items():
        value, base = alternate(lambda: bench_line(cmd, env)["per_step_s"], lambda: bench_line(raw, env)["per_step_s"],
                                repeats)
        results.append(Result("per-step time, tiny MLP, 2 processes", label, "torch DDP loop + torchrun", value,
                              base, "s/step", repeats, "1500 timed steps after 100 warm-up (mlp_common.py), batch 32 per process"))
    return results
