"""Sharding backends vs ddp on a ~200 MB model, 2 processes: per-rank peak memory and step time."""

from __future__ import annotations

from common import ACC, MEASURED, WORKLOADS, Result, alternate, bench_line, env_for_bench

from acc.assembly.plugins import installed_backends

# label -> (launch flags, workload flags). Every launch (contender and its ddp baseline alike) runs with
# --worker-memory release (freed tensors leave RSS at once, so the peak measures live memory) unless the label says
# "keep" (glibc's default, acc's default: freed memory kept for reuse). "fsdp" runs the defaults (on gloo: p2p
# all-gather and reduce-scatter, one unit prefetched in forward, the last unit kept gathered); "tuning off" is
# FSDP2's own collectives and its own (synchronous, on the CPU) prefetching. deepspeed runs acc's p2p collectives on
# gloo (--zero-collectives auto) unless the label says "native collectives".
FSDP = ["--backend", "fsdp", "--fsdp-wrap", "min_params=1000000"]
TUNING_OFF = ["--fsdp-reduce-scatter", "native", "--fsdp-all-gather", "native", "--fsdp-prefetch", "0",
              "--fsdp-prefetch-in-backward", "on", "--no-fsdp-keep-last-unsharded"]
ZERO3 = ["--backend", "deepspeed", "--zero-stage", "3"]
MODEL_BUCKETS = ["--zero-buckets", "model"]
KEEP = ["--worker-memory", "keep"]
CONTENDERS = {
    "fsdp": (FSDP, []),
    "fsdp, tuning off": ([*FSDP, *TUNING_OFF], []),
    "fsdp, init_module": (FSDP, ["--init-module"]),
    "deepspeed ZeRO-2": (["--backend", "deepspeed", "--zero-stage", "2"], []),
    "deepspeed ZeRO-3": (ZERO3, []),
    "deepspeed ZeRO-3, model buckets": ([*ZERO3, *MODEL_BUCKETS], []),
    "deepspeed ZeRO-3, model buckets, init_module": ([*ZERO3, *MODEL_BUCKETS], ["--init-module"]),
    "deepspeed ZeRO-3, model buckets, native collectives": ([*ZERO3, *MODEL_BUCKETS, "--zero-collectives", "native"],
                                                            []),
    "fsdp, worker memory keep": ([*FSDP, *KEEP], []),
    "deepspeed ZeRO-3, model buckets, worker memory keep": ([*ZERO3, *MODEL_BUCKETS, *KEEP], []),
}
SCALING_POINTS = ("fsdp", "deepspeed ZeRO-2", "deepspeed ZeRO-3", "deepspeed ZeRO-3, model buckets")


def run(repeats: int) -> list[Result]:
    env = env_for_bench()
    script = str(WORKLOADS / "sharded_step.py")
    base = [ACC, "launch", "--output-dir", "", "--nproc", "2"]
    installed = installed_backends()
    results = []
    steps: dict[str, float] = {}
    for label, (flags, args) in CONTENDERS.items():
        if flags[1] not in installed:
            continue
        runs: dict[str, list[dict]] = {"c": [], "b": []}

        memory = KEEP if "keep" in label else ["--worker-memory", "release"]

        def contender() -> float:
            runs["c"].append(bench_line([*base, *memory, *flags, script, *args], env))
            return runs["c"][-1]["per_step_s"]

        def baseline() -> float:  # the same workload and allocator (init_module builds normally on ddp)
            runs["b"].append(bench_line([*base, *memory, "--backend", "ddp", script, *args], env))
            return runs["b"][-1]["per_step_s"]

        step, base_step = alternate(contender, baseline, repeats)
        steps[label] = step
        if label in SCALING_POINTS:  # the scaling model's and the floor's points (worker memory release)
            MEASURED.setdefault("step_2proc", {})[label] = step
            MEASURED["step_2proc"]["ddp"] = base_step
        MEASURED["params_mb"] = runs["c"][0]["params_mb"]
        mem = sorted(r["peak_rss_mb"] for r in runs["c"])[len(runs["c"]) // 2]
        base_mem = sorted(r["peak_rss_mb"] for r in runs["b"])[len(runs["b"]) // 2]
        built = sorted(r["built_rss_mb"] for r in runs["c"])[len(runs["c"]) // 2]
        base_built = sorted(r["built_rss_mb"] for r in runs["b"])[len(runs["b"]) // 2]
        end = sorted(r["end_rss_mb"] for r in runs["c"])[len(runs["c"]) // 2]
        base_end = sorted(r["end_rss_mb"] for r in runs["b"])[len(runs["b"]) // 2]
        note = (f"{runs['c'][0]['params_mb']:.0f} MB of parameters, AdamW, 2 processes on gloo, worker memory "
                f"{memory[1]} (both)")
        if label != "fsdp, tuning off":  # the same memory as fsdp's
            results.append(Result("per-rank peak RSS, 2 processes", label, "ddp", mem, base_mem, "MB", repeats, note))
            results.append(Result("per-rank peak RSS of building and prepare, 2 processes", label, "ddp", built,
                                  base_built, "MB", repeats, note))
            results.append(Result("per-rank RSS after training, 2 processes", label, "ddp", end, base_end, "MB",
                                  repeats, note))
        results.append(Result("step time, 2 processes", label, "ddp", step, base_step, "s/step", repeats, note))
    if "fsdp" in steps and "fsdp, tuning off" in steps:
        results.append(Result("fsdp step time, tuned (defaults) vs tuning off", "fsdp", "fsdp, tuning off",
                              steps["fsdp"], steps["fsdp, tuning off"], "s/step", repeats,
                              "p2p all-gather and reduce-scatter, prefetch 1 in forward, last unit kept vs FSDP2's own; "
                              "not alternated with each other (each against its own ddp runs)"))
    return results
