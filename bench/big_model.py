"""load_checkpoint_and_dispatch of a 1.2 GB sharded safetensors checkpoint with a 400 MB CPU budget (the
rest on disk), then one forward: acc vs Accelerate on the same checkpoint and budget, alternating.

Each load runs in its own process (peak RSS is per process). Accelerate is not a dependency of acc:
this benchmark needs it importable in the benchmark environment (`pip install accelerate`).
"""

from __future__ import annotations

import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import WORKLOADS, Result, bench_line, env_for_bench

LOAD = WORKLOADS / "big_model_load.py"


def run(repeats: int) -> list[Result]:
    if importlib.util.find_spec("accelerate") is None:
        raise RuntimeError(f"the big_model benchmark compares against Accelerate: pip install accelerate into "
                           f"{sys.prefix} (it is not a dependency of acc)")
    root = Path(tempfile.mkdtemp(prefix="acc-bench-big-model-"))
    try:
        checkpoint = root / "checkpoint"
        subprocess.run([sys.executable, str(WORKLOADS / "big_model_common.py"), str(checkpoint)], check=True,
                       capture_output=True)
        for path in checkpoint.iterdir():  # both start from a warm page cache
            with open(path, "rb") as fp:
                while fp.read(1 << 24):
                    pass
        runs: dict[str, list[dict]] = {"acc": [], "accelerate": []}

        def once(impl: str) -> float:
            offload = root / f"offload-{impl}"
            out = bench_line([sys.executable, str(LOAD), impl, str(checkpoint), str(offload)], env_for_bench())
            shutil.rmtree(offload, ignore_errors=True)
            runs[impl].append(out)
            return out["load_s"]

        for _ in range(repeats):  # baseline first, then acc, in turns
            once("accelerate")
            once("acc")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    a, b = runs["acc"], runs["accelerate"]
    if a[0]["output"] != b[0]["output"] or a[0]["resident_bytes"] != b[0]["resident_bytes"]:
        raise RuntimeError(f"acc and Accelerate disagree (output or bytes kept in memory): {a[0]} vs {b[0]}")

    def median(rows: list[dict], key: str, scale: float = 1.0) -> float:
        return statistics.median(r[key] for r in rows) / scale

    note = (f"1.21 GB float32, 19 shards, max_memory cpu=400MB, rest on disk; both plan the same map, keep "
            f"{a[0]['resident_bytes'] / 1e6:.0f} MB in memory and give the same output; times exclude imports. "
            "Accelerate copies the disk-bound weights into offload_folder while loading; acc reads them from the "
            "checkpoint's shards when their module runs")
    title = "big-model load_checkpoint_and_dispatch"
    return [
        Result(f"{title}: load", "acc.big_model", "accelerate", median(a, "load_s"), median(b, "load_s"), "s",
               repeats, note),
        Result(f"{title}: peak RSS (load + forward)", "acc.big_model", "accelerate", median(a, "peak_rss", 1e6),
               median(b, "peak_rss", 1e6), "MB", repeats, note),
        Result(f"{title}: first forward", "acc.big_model", "accelerate", median(a, "forward_s"),
               median(b, "forward_s"), "s", repeats, note),
    ]
