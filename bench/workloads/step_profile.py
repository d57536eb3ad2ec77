"""Where a step's time goes: the sharded bench model (8 x Linear(2500, 2500), AdamW, built with init_module) on the
launched backend, 2 warm-up steps, then 3 steps under torch.profiler on every rank. Each operator's own time (not its
children's) is put in one category; what the operators do not account for is Python and waiting. Prints one BENCH
line on rank 0: seconds per step by category, the largest over ranks, and the step's wall time.
"""

import json
import time

from sharded_common import prepared, step
from torch.profiler import ProfilerActivity, profile

from acc import Accelerator

WARMUP, STEPS = 2, 3  # warm steps: the first measures (fsdp_keep_unsharded auto), the second still grows the heap
MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"}
COPIES = {"aten::copy_", "aten::cat", "aten::_chunk_cat", "aten::chunk_cat", "aten::clone", "aten::_to_copy",
          "aten::split_with_sizes_copy", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat", "aten::index_select",
          "aten::stack"}
FILLS = {"aten::zero_", "aten::fill_", "aten::zeros", "aten::zeros_like", "aten::empty", "aten::empty_like",
         "aten::empty_strided", "aten::resize_", "aten::new_empty", "aten::new_zeros"}


def category(name: str) -> str | None:
    """The category of an operator's own time (None: a region, whose time is its children's)."""
    if name in MATMUL:
        return "matmul"
    if name in COPIES:
        return "copies"
    if name in FILLS:
        return "allocation and fills"
    if name.startswith(("c10d::", "gloo:", "record_param_comms", "nccl:")) or "all_gather" in name \
            or "reduce_scatter" in name or "all_reduce" in name or name in ("aten::wait", "c10d::wait"):
        return "collectives"
    if name.startswith("aten::"):
        return "other operators (elementwise, optimizer math)"
    return None


def main() -> None:
    accelerator = Accelerator()
    model, opt, loader = prepared(accelerator, WARMUP + STEPS)
    batches = [x for (x,) in loader]
    for x in batches[:WARMUP]:
        step(accelerator, model, opt, x)
    accelerator.wait_for_everyone()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for x in batches[WARMUP:]:
            step(accelerator, model, opt, x)
        wall = (time.perf_counter() - start) / STEPS
    seconds: dict[str, float] = {}
    for event in prof.key_averages():
        kind = category(event.key)
        if kind is not None:
            seconds[kind] = seconds.get(kind, 0.0) + event.self_cpu_time_total / 1e6 / STEPS
    # the main thread's operators; gloo's own threads run collectives beside it, so the categories may overlap
    seconds["python and waiting"] = max(0.0, wall - sum(seconds.values()))
    everyone = accelerator.gather_object([{"wall": wall, **seconds}])
    if accelerator.is_main_process:
        keys = sorted({k for ranks in everyone for k in ranks})
        print("BENCH " + json.dumps({k: max(r.get(k, 0.0) for r in everyone) for k in keys}))
    accelerator.end_training()


if __name__ == "__main__":
    main()
