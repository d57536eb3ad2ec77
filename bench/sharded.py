"""Sharding backends vs ddp on a ~200 MB model, 2 processes: per-rank peak memory and step time."""

from __future__ import annotations

from common import ACC, MEASURED, WORKLOADS, Result, alternate, bench_line, env_for_bench
from acc.plugins import installed_backends

# label -> (launch flags, workload flags). "fsdp" runs the defaults (on gloo: all_to_all reduce-scatter, one unit
# prefetched, the last unit kept gathered); "tuning off" is FSDP2's own collectives without prefetching.
FSDP = ["--backend", "fsdp", "--fsdp-wrap", "min_params=1000000"]
TUNING_OFF = ["--fsdp-reduce-scatter", "native", "--fsdp-prefetch", "0", "--no-fsdp-keep-last-unsharded"]
CONTENDERS = {
    "fsdp": (FSDP, []),
    "fsdp, tuning off": ([*FSDP, *TUNING_OFF], []),
    "fsdp, init_module": (FSDP, ["--init-module"]),
    "deepspeed ZeRO-2": (["--backend", "deepspeed", "--zero-stage", "2"], []),
    "deepspeed ZeRO-3": (["--backend", "deepspeed", "--zero-stage", "3"], []),
    "deepspeed ZeRO-3, init_module": (["--backend", "deepspeed", "--zero-stage", "3"], ["--init-module"]),
}


def run(repeats: int) -> list[Result]:
    # a fixed mmap threshold makes freed tensors leave RSS at once, so the peak measures live memory rather than
    # glibc's heap growth (which otherwise hides the difference); applied to every contender alike
    env = env_for_bench(MALLOC_MMAP_THRESHOLD_="65536")
    script = str(WORKLOADS / "sharded_step.py")
    base = [ACC, "launch", "--output-dir", "", "--nproc", "2"]
    installed = installed_backends()
    results = []
    steps: dict[str, float] = {}
    for label, (flags, args) in CONTENDERS.items():
        if flags[1] not in installed:
            continue
        runs: dict[str, list[dict]] = {"c": [], "b": []}

        def contender() -> float:
            runs["c"].append(bench_line([*base, *flags, script, *args], env))
            return runs["c"][-1]["per_step_s"]

        def baseline() -> float:  # the same workload (init_module builds normally on ddp)
            runs["b"].append(bench_line([*base, "--backend", "ddp", script, *args], env))
            return runs["b"][-1]["per_step_s"]

        step, base_step = alternate(contender, baseline, repeats)
        steps[label] = step
        if label in ("fsdp", "deepspeed ZeRO-2", "deepspeed ZeRO-3"):  # the scaling model's points: the defaults
            MEASURED.setdefault("step_2proc", {})[label] = step
            MEASURED["step_2proc"]["ddp"] = base_step
        MEASURED["params_mb"] = runs["c"][0]["params_mb"]
        mem = sorted(r["peak_rss_mb"] for r in runs["c"])[len(runs["c"]) // 2]
        base_mem = sorted(r["peak_rss_mb"] for r in runs["b"])[len(runs["b"]) // 2]
        built = sorted(r["built_rss_mb"] for r in runs["c"])[len(runs["c"]) // 2]
        base_built = sorted(r["built_rss_mb"] for r in runs["b"])[len(runs["b"]) // 2]
        end = sorted(r["end_rss_mb"] for r in runs["c"])[len(runs["c"]) // 2]
        base_end = sorted(r["end_rss_mb"] for r in runs["b"])[len(runs["b"]) // 2]
        note = f"{runs['c'][0]['params_mb']:.0f} MB of parameters, AdamW, 2 processes on gloo"
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
                              "all_to_all reduce-scatter, prefetch 1, last unit kept vs FSDP2's own; not alternated "
                              "with each other (each against its own ddp runs)"))
    return results
