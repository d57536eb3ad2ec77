"""Faster sharded steps: what FSDP2 offers beyond its defaults, applied to the units `_shard` made.

Measured on gloo (CPU, 2 processes, one 12.5 MB shard per process; bench/sharded_floor.py has the per-step
figures): gloo's all-gather took 40 ms, and its reduce-scatter is an all-reduce's volume (41 ms for 25 MB of
gradients); the same bytes sent as point-to-point isend/irecv to each peer took 10 ms (all-gather) and 13-15 ms
(reduce-scatter, then a local sum in rank order), against 32 and 38 ms for all_to_all_single. So on gloo both
collectives default to `p2p`. FSDP2's all-gathers are synchronous on the CPU (no streams to overlap on) unless
unshards are asynchronous with explicit prefetching, which lets the next unit's all-gather run in gloo's thread
while this one computes. In backward, that prefetch made the step no faster on gloo (9 alternating launches of
the bench model: median 1.06 s a step with it, 1.04 s without) and held one more unit gathered at the peak (704 MB
against 692 MB per rank), so on gloo backward gathers each unit when its own backward starts. Keeping the last
units unsharded after forward saves their all-gathers in backward, as many as the peak allows (keep_unsharded.py).
"""

from __future__ import annotations

from typing import Any, Callable

from acc import backend as sdk

REDUCE_SCATTER = ("auto", "native", "all_to_all", "p2p")
ALL_GATHER = ("auto", "native", "p2p")
PREFETCH_IN_BACKWARD = ("auto", "on", "off")


def apply(ctx: sdk.RunContext, model: Any, units: list[Any]) -> None:
    """Set the custom reduce-scatter and the prefetching on the sharded `units` (in forward order, root last)."""
    reduce_scatter = _choice(ctx, "fsdp_reduce_scatter")
    comm = {"all_to_all": all_to_all_reduce_scatter, "p2p": p2p_reduce_scatter}.get(reduce_scatter, lambda: None)()
    if comm is not None and hasattr(model, "set_custom_reduce_scatter"):
        for unit in [*units, model]:
            unit.set_custom_reduce_scatter(comm)
    gather = p2p_all_gather() if _choice(ctx, "fsdp_all_gather") == "p2p" else None
    if gather is not None and hasattr(model, "set_custom_all_gather"):
        for unit in [*units, model]:
            unit.set_custom_all_gather(gather)
    if units and ctx.settings["fsdp_strategy"] != "shard_grad_op":
        from .keep_unsharded import KeepUnsharded

        ctx.backend_state.setdefault("keepers", []).append(KeepUnsharded(ctx, model, units))
    depth = ctx.settings["fsdp_prefetch"]
    backward = prefetch_in_backward(ctx)
    if depth and len(units) > 1 and hasattr(model, "_set_unshard_async_op"):
        model._set_unshard_async_op(True)  # prefetched all-gathers run in the background (no streams on the CPU)
        for i, unit in enumerate(units):
            unit.set_modules_to_forward_prefetch(units[i + 1: i + 1 + depth])
            if backward:
                unit.set_modules_to_backward_prefetch(list(reversed(units[max(0, i - depth): i])))
    if not backward and hasattr(model, "set_modules_to_backward_prefetch"):
        # FSDP2 prefetches the next unit in backward unless a unit names what to prefetch; naming the unit itself
        # (gathered already when its backward starts, so nothing is fetched) turns that off
        for unit in [*units, model]:
            unit.set_modules_to_backward_prefetch([unit])


def prefetch_in_backward(ctx: sdk.RunContext) -> bool:
    """Whether backward gathers the next unit while this one computes (the fsdp_prefetch_in_backward setting; auto:
    not on gloo, where it made the step no faster and held one more unit gathered at the backward peak)."""
    choice = ctx.settings["fsdp_prefetch_in_backward"]
    if choice == "auto":
        return ctx.process.process_group_backend != "gloo"
    return choice == "on"


def reshard_after_forward(ctx: sdk.RunContext, unit_index: int, units: int) -> bool:
    """FSDP2's reshard_after_forward for unit `unit_index` of `units` (the root is not counted) when it is sharded:
    the last units kept gathered are chosen after (keep_unsharded.KeepUnsharded)."""
    return ctx.settings["fsdp_strategy"] != "shard_grad_op"


def _choice(ctx: sdk.RunContext, setting: str) -> str:
    """The collective `setting` names (auto: the SDK's rule; p2p does not fit hybrid_shard's two-level groups)."""
    mesh = ctx.backend_state.get("mesh")
    return sdk.collectives_choice(ctx.settings[setting], ctx.process.process_group_backend,
                                  p2p_fits=ctx.settings["fsdp_strategy"] != "hybrid_shard"
                                  and (mesh is None or mesh.ndim == 1))


def _summing_reduce_scatter(sum_chunks: Callable[[Any, Any, Any], None]) -> Any:
    """A ReduceScatter (FSDP2's custom-comm interface) whose SUM is `sum_chunks(output, input, group)` (AVG: that
    sum divided by the world size; any other op, e.g. PREMUL_SUM, the process group's own), or None when FSDP2
    lacks custom collectives. Synchronous, as FSDP2 expects of a custom reduce-scatter on the CPU."""
    import torch
    import torch.distributed as dist

    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
    except ImportError:  # pragma: no cover - an FSDP2 without custom collectives keeps its own
        return None

    class SummingReduceScatter(ReduceScatter):
        def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            return _allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
            sum_chunks(output_tensor, input_tensor, group)
            if op == dist.ReduceOp.AVG:
                output_tensor.div_(group.size())
            # FSDP2 keeps the input alive until the next unit's reduce-scatter (so a CUDA stream cannot reuse it
            # early) but never reads it again; this reduce-scatter is done already, so its memory goes now (25 MB
            # at the backward peak on the bench model). Only a buffer the input owns whole: a view into a larger
            # storage (a caller's flat buffer) is left alone
            storage = input_tensor.untyped_storage()
            if input_tensor.storage_offset() == 0 and storage.nbytes() == input_tensor.nbytes:
                storage.resize_(0)
            return None

    return SummingReduceScatter()


def _allocate(size: Any, *, dtype: Any, device: Any) -> Any:
    """A custom collective's buffer: a plain tensor (FSDP2's default allocation)."""
    import torch

    return torch.empty(*size, dtype=dtype, device=device)


def all_to_all_reduce_scatter() -> Any:
    """A ReduceScatter built on all_to_all_single: each process sends chunk j of its gradients to process j and
    sums the W chunks it receives; None when FSDP2 lacks custom collectives."""
    import torch
    import torch.distributed as dist

    def sum_chunks(output_tensor: Any, input_tensor: Any, group: Any) -> None:
        received = torch.empty_like(input_tensor)
        dist.all_to_all_single(received, input_tensor, group=group)
        torch.sum(received.view(group.size(), -1), dim=0, out=output_tensor)

    return _summing_reduce_scatter(sum_chunks)


def p2p_all_gather() -> Any:
    """An AllGather (FSDP2's custom-comm interface) that sends this process's shard to each peer with isend and
    receives theirs with irecv, or None when FSDP2 lacks custom all-gathers."""
    import torch

    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather
    except ImportError:  # pragma: no cover - an FSDP2 without custom collectives keeps its own
        return None

    class P2PAllGather(AllGather):
        def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            return _allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                     async_op: bool = False) -> Any:
            return sdk.p2p_all_gather_into(output_tensor, input_tensor, group, async_op)

    return P2PAllGather()


def p2p_reduce_scatter() -> Any:
    """A ReduceScatter that sends chunk p of the gradients to each peer p with isend, receives the peers' chunks
    of its own part with irecv and sums the W chunks in rank order (the sum all_to_all_reduce_scatter computes)."""
    return _summing_reduce_scatter(sdk.p2p_reduce_scatter_sum)
