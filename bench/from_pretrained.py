"""transformers' from_pretrained(device_map="auto", max_memory={"cpu": 150MB}, offload_folder=...) of a ~420 MB
float32 Llama checkpoint (the rest on disk), then one forward: on acc's `accelerate` drop-in vs on Hugging Face
Accelerate 1.15, each in its venv of the drop-in lane (scripts/dropin-venv.sh), same checkpoint, alternating.
Each load runs in its own process (peak RSS is per process).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from common import ROOT, WORKLOADS, Result, bench_line, env_for_bench

LOAD = WORKLOADS / "from_pretrained_load.py"


def _venv(which: str) -> str:
    proc = subprocess.run([str(ROOT / "scripts" / "dropin-venv.sh"), which], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/dropin-venv.sh {which} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def run(repeats: int) -> list[Result]:
    pythons = {"acc": _venv("acc"), "accelerate": _venv("accelerate")}
    env = env_for_bench(HF_HUB_OFFLINE="1", ACC_DROPIN_QUIET="1", TRANSFORMERS_VERBOSITY="error")
    root = Path(tempfile.mkdtemp(prefix="acc-bench-from-pretrained-"))
    runs: dict[str, list[dict]] = {"acc": [], "accelerate": []}
    try:
        checkpoint = root / "checkpoint"
        subprocess.run([pythons["accelerate"], str(LOAD), "make", str(checkpoint)], check=True, capture_output=True,
                       env=env)
        for path in checkpoint.iterdir():  # both start from a warm page cache
            with open(path, "rb") as fp:
                while fp.read(1 << 24):
                    pass
        for _ in range(repeats):  # baseline first, then acc, in turns
            for impl in ("accelerate", "acc"):
                offload = root / f"offload-{impl}"
                runs[impl].append(bench_line([pythons[impl], str(LOAD), "load", str(checkpoint), str(offload)], env))
                shutil.rmtree(offload, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    a, b = runs["acc"], runs["accelerate"]
    if "+acc." not in a[0]["accelerate"] or "+acc." in b[0]["accelerate"]:
        raise RuntimeError(f"the venvs serve the wrong accelerate: {a[0]['accelerate']}, {b[0]['accelerate']}")
    if a[0]["device_map"] != b[0]["device_map"] or \
            max(abs(x - y) for x, y in zip(a[0]["output"], b[0]["output"], strict=True)) > 1e-5:
        raise RuntimeError(f"acc and Accelerate disagree (device map or logits): {a[0]} vs {b[0]}")

    def median(rows: list[dict], key: str, scale: float = 1.0) -> float:
        return statistics.median(r[key] for r in rows) / scale

    on_disk = sum(1 for v in a[0]["device_map"].values() if v == "disk")
    note = (f"Llama 12 x 768, ~420 MB float32 in 100 MB safetensors shards, max_memory cpu=150MB: both plan the "
            f"same map ({on_disk} of {len(a[0]['device_map'])} entries on disk) and give the same logits; whole "
            "processes, imports included in the peak, not in the times")
    title = "transformers from_pretrained with disk offload"
    return [
        Result(f"{title}: load", "acc drop-in", "accelerate", median(a, "load_s"), median(b, "load_s"), "s",
               repeats, note),
        Result(f"{title}: peak RSS (load + forward)", "acc drop-in", "accelerate", median(a, "peak_rss", 1e6),
               median(b, "peak_rss", 1e6), "MB", repeats, note),
        Result(f"{title}: first forward", "acc drop-in", "accelerate", median(a, "forward_s"),
               median(b, "forward_s"), "s", repeats, note),
    ]
