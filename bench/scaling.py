"""Scaling on paper: per-step communication volume of ddp, fsdp (full shard) and ZeRO-3 from the parameter
count and the number of processes, turned into step-time curves with the bandwidth measured here, and the
measured 1- and 2-process points on top (bench/results/scaling.png).

Per process and step, for P parameters of b bytes and W processes (ring collectives):
  ddp     all-reduce of the gradients:                                   2 (W-1)/W * P b
  fsdp    all-gather of parameters in forward and backward, reduce-scatter of gradients: 3 (W-1)/W * P b
  ZeRO-3  the same three collectives as fsdp:                             3 (W-1)/W * P b
(On gloo, FSDP2's own reduce-scatter is an all-reduce's volume, 4 (W-1)/W in all; acc's fsdp default, p2p
isend/irecv collectives, is the 3 above, less one unit's all-gather with the last unit kept gathered.)
Model: t(W) = t_compute + volume(W) / bandwidth, with t_compute the 1-process step and bandwidth fitted from
the measured 2-process ddp step. The fsdp and ZeRO-3 points at W = 2 are then predictions to compare. What this
model leaves out, sharded_floor.py measures: gloo's collectives do not share one bandwidth (its all-gather moved
the same bytes 4x slower than isend/irecv), and a sharded step's AdamW runs over 1/W of the parameters.
"""

from __future__ import annotations

from common import ACC, MEASURED, ROOT, WORKLOADS, Result, bench_line, env_for_bench

FACTOR = {"ddp": 2.0, "fsdp": 3.0, "deepspeed ZeRO-3": 3.0}


def volume(strategy: str, params_bytes: float, world: int) -> float:
    return FACTOR[strategy] * (world - 1) / world * params_bytes


def run(repeats: int) -> list[Result]:
    env = env_for_bench()
    script = str(WORKLOADS / "sharded_step.py")
    release = ["--worker-memory", "release"]  # as sharded.py's points
    one = bench_line([ACC, "launch", "--output-dir", "", *release, "--backend", "ddp", "--nproc", "1", script], env)
    measured = dict(MEASURED.get("step_2proc", {}))
    if "ddp" not in measured:
        measured["ddp"] = bench_line([ACC, "launch", "--output-dir", "", *release, "--backend", "ddp", "--nproc", "2",
                                      script], env)["per_step_s"]
    params_bytes = one["params_mb"] * 1e6
    t1 = one["per_step_s"]
    bandwidth = volume("ddp", params_bytes, 2) / max(measured["ddp"] - t1, 1e-9)
    worlds = list(range(1, 9))
    curves = {s: [t1 + volume(s, params_bytes, w) / bandwidth for w in worlds] for s in FACTOR}
    _plot(worlds, curves, t1, measured, one["params_mb"], bandwidth)
    results = []
    for strategy in ("fsdp", "deepspeed ZeRO-3"):
        if strategy in measured:
            predicted = curves[strategy][1]
            results.append(Result("scaling model: 2-process step, measured vs predicted", strategy,
                                  "communication-volume model", measured[strategy], predicted, "s/step", 1,
                                  f"bandwidth fitted from ddp: {bandwidth / 1e9:.2f} GB/s; plot in bench/results/"
                                  "scaling.png"))
    return results


def _plot(worlds: list[int], curves: dict, t1: float, measured: dict, params_mb: float, bandwidth: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"ddp": "tab:blue", "fsdp": "tab:orange", "deepspeed ZeRO-3": "tab:green"}
    for strategy, times in curves.items():
        ax.plot(worlds, times, "-", color=colors[strategy], label=f"{strategy} (model)")
        if strategy in measured:
            ax.plot([2], [measured[strategy]], "o", color=colors[strategy], label=f"{strategy} measured")
    ax.plot([1], [t1], "ks", label="1 process measured")
    ax.set_xlabel("processes")
    ax.set_ylabel("seconds per step")
    ax.set_title(f"{params_mb:.0f} MB model, gloo on CPU (fitted bandwidth {bandwidth / 1e9:.2f} GB/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out = ROOT / "bench" / "results" / "scaling.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
