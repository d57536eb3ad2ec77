"""N-D parallelism on 4 processes (gloo): TP x FSDP and HSDP beside fsdp, each against ddp in the same run, on a
transformer-MLP stack (bench/workloads/mesh_step.py): step time and per-rank peak RSS, with each layout's predicted
bytes sent per rank per step beside the measured figures (ring collectives; FSDP units = the 4 blocks)."""

from __future__ import annotations

from common import ACC, WORKLOADS, Result, alternate, bench_line, env_for_bench

from acc.assembly.plugins import installed_backends

WORLD, UNITS = 4, 4
FSDP = ["--backend", "fsdp", "--fsdp-wrap", "transformer_layer=Block"]
CONTENDERS = {  # label -> (launch flags, workload args, (dp_replicate, dp_shard, tp))
    "fsdp 4": (FSDP, [], (1, 4, 1)),
    "TP 2 x FSDP 2": (FSDP, ["--sizes", "tp=2", "dp_shard=2"], (1, 2, 2)),
    "HSDP 2 x 2": (FSDP, ["--sizes", "dp_replicate=2", "dp_shard=2"], (2, 2, 1)),
}


def predicted_mb(params_mb: float, activation_mb: float, replicate: int, shard: int, tp: int) -> float:
    """MB each rank sends per step: the all-gathers (forward, and backward but for the last unit, kept gathered) and
    the reduce-scatter of fsdp over `shard` on 1/tp of the parameters, the all-reduce of each shard over `replicate`,
    and tp's two activation all-reduces per block (forward after the rowwise Linear, backward before the colwise)."""
    part = params_mb / tp
    gathers = (shard - 1) / shard * part * (2 * UNITS - 1) / UNITS
    scatter = (shard - 1) / shard * part
    across = 2 * (replicate - 1) / replicate * part / shard
    tensor = UNITS * 2 * 2 * (tp - 1) / tp * activation_mb
    return gathers + scatter + across + tensor


def run(repeats: int) -> list[Result]:
    env = env_for_bench()
    script = str(WORKLOADS / "mesh_step.py")
    base = [ACC, "launch", "--output-dir", "", "--worker-memory", "release", "--nproc", str(WORLD)]
    if "fsdp" not in installed_backends():
        return []
    results = []
    for label, (flags, args, (replicate, shard, tp)) in CONTENDERS.items():
        runs: dict[str, list[dict]] = {"c": [], "b": []}

        def contender() -> float:
            runs["c"].append(bench_line([*base, *flags, script, *args], env))
            return runs["c"][-1]["per_step_s"]

        def baseline() -> float:
            runs["b"].append(bench_line([*base, "--backend", "ddp", script], env))
            return runs["b"][-1]["per_step_s"]

        step, base_step = alternate(contender, baseline, repeats)
        first = runs["c"][0]
        mem = sorted(r["peak_rss_mb"] for r in runs["c"])[len(runs["c"]) // 2]
        base_mem = sorted(r["peak_rss_mb"] for r in runs["b"])[len(runs["b"]) // 2]
        activation = first["rows_per_dp_rank"] * first["activation_mb_per_row"]
        sent = predicted_mb(first["params_mb"], activation, replicate, shard, tp)
        ddp_sent = 2 * (WORLD - 1) / WORLD * first["params_mb"]
        note = (f"{first['params_mb']:.0f} MB of parameters, AdamW, 4 processes on gloo (2 cores), global batch 16; "
                f"predicted sent per rank per step: {sent:.0f} MB ({label}) vs {ddp_sent:.0f} MB (ddp all-reduce)")
        results.append(Result("N-D step time, 4 processes", label, "ddp", step, base_step, "s/step", repeats, note))
        results.append(Result("N-D per-rank peak RSS, 4 processes", label, "ddp", mem, base_mem, "MB", repeats, note))
    return results
