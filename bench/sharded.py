"""Sharding backends vs ddp on a ~200 MB model, 2 processes: per-rank peak memory and step time."""

from __future__ import annotations

from common import ACC, MEASURED, WORKLOADS, Result, alternate, bench_line, env_for_bench
from acc.plugins import installed_backends

CONTENDERS = {
    "fsdp": ["--backend", "fsdp", "--fsdp-wrap", "min_params=1000000"],
    "deepspeed ZeRO-2": ["--backend", "deepspeed", "--zero-stage", "2"],
    "deepspeed ZeRO-3": ["--backend", "deepspeed", "--zero-stage", "3"],
}


def run(repeats: int) -> list[Result]:
    # a fixed mmap threshold makes freed tensors leave RSS at once, so the peak measures live memory rather than
    # glibc's heap growth (which otherwise hides the difference); applied to every contender alike
    env = env_for_bench(MALLOC_MMAP_THRESHOLD_="65536")
    script = str(WORKLOADS / "sharded_step.py")
    base = [ACC, "launch", "--output-dir", "", "--nproc", "2"]
    installed = installed_backends()
    results = []
    for label, flags in CONTENDERS.items():
        if flags[1] not in installed:
            continue
        runs: dict[str, list[dict]] = {"c": [], "b": []}

        def contender() -> float:
            runs["c"].append(bench_line([*base, *flags, script], env))
            return runs["c"][-1]["per_step_s"]

        def baseline() -> float:
            runs["b"].append(bench_line([*base, "--backend", "ddp", script], env))
            return runs["b"][-1]["per_step_s"]

        step, base_step = alternate(contender, baseline, repeats)
        MEASURED.setdefault("step_2proc", {})[label] = step
        MEASURED["step_2proc"]["ddp"] = base_step
        MEASURED["params_mb"] = runs["c"][0]["params_mb"]
        mem = sorted(r["peak_rss_mb"] for r in runs["c"])[len(runs["c"]) // 2]
        base_mem = sorted(r["peak_rss_mb"] for r in runs["b"])[len(runs["b"]) // 2]
        end = sorted(r["end_rss_mb"] for r in runs["c"])[len(runs["c"]) // 2]
        base_end = sorted(r["end_rss_mb"] for r in runs["b"])[len(runs["b"]) // 2]
        note = f"{runs['c'][0]['params_mb']:.0f} MB of parameters, AdamW, 2 processes on gloo"
        results.append(Result("per-rank peak RSS, 2 processes", label, "ddp", mem, base_mem, "MB", repeats, note))
        results.append(Result("per-rank RSS after training, 2 processes", label, "ddp", end, base_end, "MB", repeats,
                              note))
        results.append(Result("step time, 2 processes", label, "ddp", step, base_step, "s/step", repeats, note))
    return results
