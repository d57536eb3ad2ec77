"""A ~200 MB model (8 x Linear(2500, 2500), AdamW) trained a few steps on the launched backend; prints the
per-step time, the largest per-rank peak RSS (VmHWM, model construction included), rank 0's split of a step into
forward, backward and optimizer step, and rank 0's CPU time a step (its main thread's, and the whole process's with
gloo's threads) as one BENCH line on rank 0.
`--init-module`: the model is built inside `accelerator.init_module()` (sharded as built under fsdp and ZeRO-3).
`--steps N`: the warm steps timed (8 unless given)."""

import json
import sys
import time

import torch
from sharded_common import prepared, step

from acc import Accelerator

WARMUP, STEPS = 2, 8  # warm-up: the first step measures (fsdp_keep_unsharded auto), the second still grows the heap


def rss_mb(field: str) -> float:
    """VmHWM (peak) or VmRSS (now) of this process, in MB."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def minor_faults() -> int:
    """Page faults this process took that needed no disk read (fresh pages included), from /proc/self/stat."""
    with open("/proc/self/stat") as fp:
        return int(fp.read().rsplit(")", 1)[1].split()[7])


def main() -> None:
    args = sys.argv[1:]
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else STEPS
    accelerator = Accelerator()
    model, opt, loader = prepared(accelerator, WARMUP + steps, init_module="--init-module" in args)
    # the whole model's size on every backend: a DTensor's numel and ZeRO-3's ds_numel are the unsharded ones
    params_mb = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()) * 4 / 1e6
    built = accelerator.gather_object([rss_mb("VmHWM")])  # the peak of building and preparing the model
    phases = [0.0, 0.0, 0.0]
    for i, (x,) in enumerate(loader):
        if i == WARMUP:
            accelerator.wait_for_everyone()
            start, cpu_start, process_start = time.perf_counter(), time.thread_time(), time.process_time()
            faults = minor_faults()
        took = step(accelerator, model, opt, x)
        if i >= WARMUP:
            phases = [a + b for a, b in zip(phases, took)]
    # CPU time in the steps (the wait below is not): this thread's, and every thread's of this process
    cpu, process_cpu = (time.thread_time() - cpu_start) / steps, (time.process_time() - process_start) / steps
    accelerator.wait_for_everyone()
    per_step = (time.perf_counter() - start) / steps
    faults = accelerator.gather_object([(minor_faults() - faults) / steps])
    cuda = accelerator.device.type == "cuda"
    peak_cuda = accelerator.gather_object([torch.cuda.max_memory_allocated(accelerator.device) / 1e6 if cuda else 0.0])
    peaks = accelerator.gather_object([rss_mb("VmHWM")])
    ends = accelerator.gather_object([rss_mb("VmRSS")])
    if accelerator.is_main_process:
        print("BENCH " + json.dumps({"per_step_s": per_step, "peak_rss_mb": max(peaks), "end_rss_mb": max(ends),
                                     "built_rss_mb": max(built), "minor_faults_per_step": max(faults),
                                     "params_mb": params_mb,
                                     # rank 0's forward, backward and optimizer step (zero_grad included)
                                     "phases_s": dict(zip(("forward", "backward", "optimizer step"),
                                                          (p / steps for p in phases))),
                                     # rank 0's main thread: on a core, and off it (waiting for a collective or
                                     # for a core) = the step's wall time less that
                                     "main_thread_cpu_s": cpu, "process_cpu_s": process_cpu,
                                     **({"peak_cuda_mb": max(peak_cuda)} if cuda else {})}))
    accelerator.end_training()


if __name__ == "__main__":
    main()
