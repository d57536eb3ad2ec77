"""save_state / load_state of a ~100 MB model vs plain torch.save / torch.load of the same state dicts, and the
same workload under Hugging Face Accelerate (each library against torch.save in its own process, then acc
against Accelerate, the two processes alternating)."""

from __future__ import annotations

import importlib.util
import statistics
import sys

from common import ACC, WORKLOADS, Result, bench_line, env_for_bench


def run(repeats: int) -> list[Result]:
    env = env_for_bench()
    acc_cmd = [ACC, "launch", "--output-dir", "", str(WORKLOADS / "checkpoint_io.py"), str(repeats)]
    accelerate_cmd = [sys.executable, str(WORKLOADS / "accelerate_checkpoint_io.py"), str(repeats)]
    with_accelerate = importlib.util.find_spec("accelerate") is not None
    acc_runs, accelerate_runs = [], []
    for _ in range(2 if with_accelerate else 1):
        acc_runs.append(bench_line(acc_cmd, env))
        if with_accelerate:
            try:
                accelerate_runs.append(bench_line(accelerate_cmd, env))
            except RuntimeError as exc:  # the peer's failure must not lose acc's figures
                print(f"   Accelerate's checkpoint workload failed: {str(exc)[-1500:]}", flush=True)
                with_accelerate = False

    def median(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    out = acc_runs[0]
    note = (f"{out['params_mb']:.0f} MB of parameters + AdamW state; acc also hashes every file (BLAKE3, while "
            "writing it), fsyncs each file and the directory, renames atomically, and loading verifies the hashes")
    n = repeats * len(acc_runs)
    results = [
        Result("checkpoint save", "acc save_state", "torch.save", median(acc_runs, "acc_save"),
               median(acc_runs, "torch_save"), "s", n, note),
        Result("checkpoint load", "acc load_state", "torch.load + load_state_dict", median(acc_runs, "acc_load"),
               median(acc_runs, "torch_load"), "s", n, note),
    ]
    if accelerate_runs:
        peer = "Accelerate's save_state writes the same state with torch.save/safetensors, without fsync or hashes"
        results += [
            Result("checkpoint save", "Hugging Face Accelerate save_state", "torch.save",
                   median(accelerate_runs, "accelerate_save"), median(accelerate_runs, "torch_save"), "s", n, peer),
            Result("checkpoint save", "acc save_state", "Hugging Face Accelerate save_state",
                   median(acc_runs, "acc_save"), median(accelerate_runs, "accelerate_save"), "s", n,
                   "each in its own process, the two alternating"),
            Result("checkpoint load", "acc load_state", "Hugging Face Accelerate load_state",
                   median(acc_runs, "acc_load"), median(accelerate_runs, "accelerate_load"), "s", n,
                   "each in its own process, the two alternating"),
        ]
    return results
