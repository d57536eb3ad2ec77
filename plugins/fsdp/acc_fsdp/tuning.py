"""Faster sharded steps: what FSDP2 offers beyond its defaults, applied to the units `_shard` made.

Measured on gloo (CPU, 2 processes; bench/sharded.py): FSDP2's default reduce-scatter on gloo is gloo's own, which
reduces the whole gradient and keeps a slice (an all-reduce's volume, twice a reduce-scatter's); an all-to-all of
the gradient chunks followed by a local sum moves each chunk once. FSDP2's all-gathers are
synchronous on the CPU (no streams to overlap on) unless unshards are asynchronous with explicit prefetching, which
lets the next unit's all-gather run in gloo's thread while this one computes. Keeping the last unit unsharded after
forward saves its all-gather at the start of backward, at no cost in peak memory (backward needs it at once); a
forward without backward (evaluation) reshards it at once.
"""

from __future__ import annotations

from typing import Any

from acc import backend as sdk

REDUCE_SCATTER = ("auto", "native", "all_to_all")


def apply(ctx: sdk.RunContext, model: Any, units: list[Any]) -> None:
    """Set the custom reduce-scatter and the prefetching on the sharded `units` (in forward order, root last)."""
    if _all_to_all_wanted(ctx):
        comm = all_to_all_reduce_scatter()
        if comm is not None and hasattr(model, "set_custom_reduce_scatter"):
            for unit in [*units, model]:
                unit.set_custom_reduce_scatter(comm)
    if units and not reshard_after_forward(ctx, len(units) - 1, len(units)) and \
            ctx.settings["fsdp_strategy"] != "shard_grad_op":
        units[-1].register_forward_hook(_reshard_without_backward)
    depth = ctx.settings["fsdp_prefetch"]
    if depth and len(units) > 1 and hasattr(model, "_set_unshard_async_op"):
        model._set_unshard_async_op(True)  # prefetched all-gathers run in the background (no streams on the CPU)
        for i, unit in enumerate(units):
            unit.set_modules_to_forward_prefetch(units[i + 1: i + 1 + depth])
            unit.set_modules_to_backward_prefetch(list(reversed(units[max(0, i - depth): i])))


def reshard_after_forward(ctx: sdk.RunContext, unit_index: int, units: int) -> bool:
    """FSDP2's reshard_after_forward for unit `unit_index` of `units` (the root is not counted)."""
    if ctx.settings["fsdp_strategy"] == "shard_grad_op":
        return False
    last = unit_index == units - 1
    return not (last and ctx.settings["fsdp_keep_last_unsharded"])


def _reshard_without_backward(module: Any, args: Any, output: Any) -> None:
    """The last unit is kept gathered for the backward that follows; a forward without one (evaluation, no_grad)
    reshards it at once, so memory after evaluation is what full_shard promises."""
    import torch

    if not torch.is_grad_enabled():
        module.reshard()


def _all_to_all_wanted(ctx: sdk.RunContext) -> bool:
    choice = ctx.settings["fsdp_reduce_scatter"]
    if choice == "auto":
        return ctx.process.process_group_backend == "gloo" and ctx.settings["fsdp_strategy"] != "hybrid_shard"
    return choice == "all_to_all"


def all_to_all_reduce_scatter() -> Any:
    """A ReduceScatter (FSDP2's custom-comm interface) built on all_to_all_single, or None when FSDP2 lacks it."""
    import torch
    import torch.distributed as dist

    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
    except ImportError:  # pragma: no cover - an FSDP2 without custom collectives keeps its own
        return None

    class AllToAllReduceScatter(ReduceScatter):
        """Each process sends chunk j of its gradients to process j and sums the W chunks it receives."""

        def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            world = group.size()
            if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):  # e.g. PREMUL_SUM: gloo's own
                return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
            received = torch.empty_like(input_tensor)
            dist.all_to_all_single(received, input_tensor, group=group)  # synchronous (FSDP2 waits on its stream)
            torch.sum(received.view(world, -1), dim=0, out=output_tensor)
            if op == dist.ReduceOp.AVG:
                output_tensor.div_(world)
            return None

    return AllToAllReduceScatter()
