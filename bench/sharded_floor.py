"""How close ddp, fsdp and ZeRO-3 steps are to the floor this machine sets: compute and raw gloo collectives on
the sharded bench model (workloads/sharded_floor.py times each piece on both processes at once), added serially.

For the 8 units of the bench model (P parameters, W = 2 processes), per step, each collective at the fastest way
measured here to move its bytes (acc's fsdp p2p all-gather and reduce-scatter):
  ddp floor     compute_full + all-reduce of the gradients (25 MB buckets)
  fsdp floor    compute_sharded + all-gather * (8 + 7) / 8 + reduce-scatter: forward gathers 8 units, backward 7
                (acc keeps the last unit gathered)
  ZeRO-3 floor  compute_sharded + 2 * all-gather + reduce-scatter: fsdp's collective volume, with backward
                gathering every unit again (DeepSpeed keeps none)
A serial floor is not a strict bound (a step may overlap communication with compute), but with 2 processes on
2 cores gloo's threads compete with compute for the same cores. Step times are sharded's (MEASURED["step_2proc"],
worker_memory release) when it ran earlier in the same run, else one sharded_step.py run each here.
"""

from __future__ import annotations

from common import ACC, MEASURED, WORKLOADS, Result, bench_line, env_for_bench

from acc.assembly.plugins import installed_backends

CONTENDERS = {"ddp": ["--backend", "ddp"], "fsdp": ["--backend", "fsdp", "--fsdp-wrap", "min_params=1000000"],
              "deepspeed ZeRO-3": ["--backend", "deepspeed", "--zero-stage", "3"],
              "deepspeed ZeRO-3, model buckets": ["--backend", "deepspeed", "--zero-stage", "3", "--zero-buckets",
                                                  "model"]}
STEP = "step time vs its serial floor (compute + raw gloo collectives), 2 processes"
FLOOR = "serial floor vs ddp's measured step, 2 processes"
COMM = "gloo collectives per step on the bench model, same bytes per rank, 2 processes"


def floors(f: dict) -> dict[str, float]:
    """Serial floors from the workload's figures (seconds per step)."""
    units = f["units"]
    gather = min(f["allgather_s"], f["allgather_p2p_s"])
    scatter = min(f["reduce_scatter_p2p_s"], f["reduce_scatter_all_to_all_s"])
    zero3 = f["compute_sharded_s"] + 2 * gather + scatter
    return {"ddp": f["compute_full_s"] + f["allreduce_s"],
            "fsdp": f["compute_sharded_s"] + gather * (2 * units - 1) / units + scatter,
            "deepspeed ZeRO-3": zero3, "deepspeed ZeRO-3, model buckets": zero3}


def run(repeats: int) -> list[Result]:
    env = env_for_bench()
    base = [ACC, "launch", "--output-dir", "", "--nproc", "2", "--worker-memory", "release"]  # as sharded.py's
    f = bench_line([*base, "--backend", "ddp", str(WORKLOADS / "sharded_floor.py"), "--repeats", str(repeats)], env)
    steps = dict(MEASURED.get("step_2proc", {}))
    installed = installed_backends()
    for label, flags in CONTENDERS.items():
        if label not in steps and flags[1] in installed:
            steps[label] = bench_line([*base, *flags, str(WORKLOADS / "sharded_step.py")], env)["per_step_s"]
    floor = floors(f)
    mb, n = f["params_mb"], repeats
    pieces = (f"compute {f['compute_full_s']:.3f} s full / {f['compute_sharded_s']:.3f} s sharded, all-reduce "
              f"{f['allreduce_s']:.3f} s, all-gather {f['allgather_p2p_s']:.3f} s (p2p), reduce-scatter "
              f"{f['reduce_scatter_p2p_s']:.3f} s (p2p)")
    notes = {"ddp": f"measured step vs compute_full + all-reduce ({pieces}); DDP overlaps them, so it may go below",
             "fsdp": f"measured step (defaults) vs compute_sharded + all-gather x 15/8 + reduce-scatter ({pieces})",
             "deepspeed ZeRO-3": "measured step (DeepSpeed's bucket sizes) vs compute_sharded + all-gather x 2 + "
                                 "reduce-scatter: fsdp's collective volume with no unit kept gathered",
             "deepspeed ZeRO-3, model buckets": "the same with --zero-buckets model (buckets sized from the hidden "
                                                "size)"}
    results = [Result(STEP, label, f"{label} floor", steps[label], floor[label], "s/step", n, notes[label])
               for label in CONTENDERS if label in steps]
    if "ddp" in steps:
        floor_notes = {
            "ddp": "ddp's floor vs its own step: below 1 where DDP hides the all-reduce behind backward",
            "fsdp": "the best serial fsdp step gloo allows, against ddp's step (issue 25 asks fsdp <= 1.3 x ddp)",
            "deepspeed ZeRO-3": "the best serial ZeRO-3 step gloo allows (one more unit gathered than fsdp)",
        }
        results += [Result(FLOOR, f"{label} floor", "ddp step", floor[label], steps["ddp"], "s/step", n, note)
                    for label, note in floor_notes.items()]
    half = f["allreduce_s"] / 2  # an all-reduce moves 2 (W-1)/W P per rank, an all-gather or reduce-scatter half
    results += [
        Result(COMM, "all-gather (gloo all_gather_single, 8 units)", "all-reduce / 2 (25 MB buckets)",
               f["allgather_s"], half, "s", n, f"{mb:.0f} MB gathered from half shards vs half of all-reducing "
                                               f"{mb:.0f} MB: the same bytes sent and received per rank"),
        Result(COMM, "reduce-scatter (acc's p2p, 8 units)", "all-reduce / 2 (25 MB buckets)",
               f["reduce_scatter_p2p_s"], half, "s", n, "acc's fsdp reduce-scatter on gloo vs half an all-reduce of "
                                                       "the same gradients: the same bytes per rank"),
        Result(COMM, "reduce-scatter (acc's p2p, 8 units)", "reduce-scatter (all_to_all_single + sum, 8 units)",
               f["reduce_scatter_p2p_s"], f["reduce_scatter_all_to_all_s"], "s", n,
               "the same chunks exchanged by isend/irecv vs all_to_all_single"),
        Result(COMM, "all-gather (acc's p2p, 8 units)", "all-gather (gloo all_gather_single, 8 units)",
               f["allgather_p2p_s"], f["allgather_s"], "s", n, "the same all-gather, a send and a receive with each "
                                                               "peer vs gloo's collective"),
        Result("local work per step (forward + backward + AdamW), no communication, 2 processes",
               "sharded (AdamW over half)", "full (ddp)", f["compute_sharded_s"], f["compute_full_s"], "s/step", n,
               f"{mb:.0f} MB of parameters, batch 8 per rank; the optimizer over a 1/W shard is what sharding saves"),
    ]
    return results
