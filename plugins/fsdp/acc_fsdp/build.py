"""Models built sharded: the build fsdp answers `acc_init_module` with, and how prepare gives a model's shards their
values when they do not come from a whole model on this process (a meta-device build, or rank 0's weights)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

from acc import backend as sdk


def shard_coordinate(ctx: sdk.RunContext) -> tuple[int, int]:
    """(processes a tensor is split over, this process's index among them): the whole world, or one machine's
    processes under hybrid_shard (the mesh is machines x processes per machine)."""
    world = ctx.num_processes
    if ctx.settings["fsdp_strategy"] == "hybrid_shard":
        size = world // ctx.settings["num_machines"]
        return size, ctx.process_index % size
    return world, ctx.process_index


def new_build(ctx: sdk.RunContext, empty_init: bool | None) -> sdk.ShardedBuild:
    """Parameters on the meta device, FSDP2's dim-0 shards initialised (or, with empty_init, loaded) part by part.
    Prepare finds the build again in ctx.backend_state["builds"] once a model was built in it (asking the hook, as
    prepare does to learn whether meta models are accepted, leaves nothing behind)."""
    size, index = shard_coordinate(ctx)
    return _registered()(ctx.backend_state.setdefault("builds", []), sdk.dim0_split(size), index,
                         ctx.communicator.broadcast_object, initialize=empty_init is not True)


@functools.cache
def _registered() -> type:
    """MetaBuild, registering itself when its context ends (made on first use: the SDK's build imports torch)."""

    class RegisteredBuild(sdk.MetaBuild):
        def __init__(self, into: list, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self._into = into

        @contextlib.contextmanager
        def context(self) -> Iterator[None]:
            with super().context():
                yield
            self._into.append(self)

    return RegisteredBuild


def initial_parts(ctx: sdk.RunContext, model: Any) -> dict[str, Any] | None:
    """name -> this process's part (1-D) of each parameter when the shards must be filled after sharding (the
    model has meta parameters, or fsdp_from_rank0 takes rank 0's values); None: shard the model as it is."""
    params = dict(model.named_parameters())
    if ctx.settings["fsdp_from_rank0"]:
        return _scattered_from_rank0(ctx, model, params)
    if not any(p.is_meta for p in params.values()):
        return None
    size, index = shard_coordinate(ctx)
    builds = ctx.backend_state.get("builds", [])
    if any(p.is_meta and not any(b.owns(p) for b in builds) for p in params.values()):
        # built under acc.init_empty_weights(): every module's reset_parameters(), from rank 0's random state now
        adopted = sdk.MetaBuild(sdk.dim0_split(size), index, ctx.communicator.broadcast_object)
        adopted.adopt(model)
        builds = [*builds, adopted]
    split = sdk.dim0_split(size)
    parts, missing = {}, []
    for name, param in params.items():
        if not param.is_meta:
            start, stop = split(tuple(param.shape), index)
            parts[name] = param.detach().reshape(-1)[start:stop].clone()
            continue
        value = next((b.take(param) for b in builds if b.owns(param)), None)
        if value is None:
            missing.append(name)
        parts[name] = value
    if missing:
        raise sdk.AccError(
            f"{len(missing)} parameter(s) of the model have no values ({', '.join(missing[:5])}): they were built on "
            "the meta device and neither initialised (their modules have no reset_parameters(), or "
            "init_module(empty_init=True) skipped it) nor loaded; load them before prepare "
            "(acc.load_checkpoint_in_model(model, path) reads each process's part), give their modules a "
            "reset_parameters(), or build without empty_init=True")
    return parts


def _scattered_from_rank0(ctx: sdk.RunContext, model: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's values (Accelerate's sync_module_states / cpu_ram_efficient_loading: only rank 0 needs the real
    weights, the others may have built on the meta device): each process receives only its part of each parameter
    (a scatter, tensor by tensor); buffers are broadcast whole."""
    import torch
    import torch.distributed as dist

    empty = [n for n, p in params.items() if p.is_meta] if ctx.process_index == 0 else []
    empty = ctx.communicator.broadcast_object(empty, 0)
    if empty:
        raise sdk.AccError(
            f"fsdp_from_rank0 takes every parameter from process 0, but {len(empty)} of them are on "
            f"the meta device ({', '.join(empty[:5])}): build (or load) the real model on process 0, e.g. `with "
            "acc.init_empty_weights() if not accelerator.is_main_process else contextlib.nullcontext():`")
    size, index = shard_coordinate(ctx)
    split = sdk.dim0_split(size)
    parts = {}
    for name, param in params.items():
        shape = tuple(param.shape)
        ranges = [split(shape, rank % size) for rank in range(ctx.num_processes)]
        longest = max(stop - start for start, stop in ranges)
        received = torch.empty(longest, dtype=param.dtype, device=ctx.device)
        pieces = None
        if ctx.process_index == 0:
            flat = param.detach().reshape(-1).to(ctx.device)
            pieces = []
            for start, stop in ranges:
                piece = torch.zeros(longest, dtype=param.dtype, device=ctx.device)
                piece[: stop - start] = flat[start:stop]
                pieces.append(piece)
        dist.scatter(received, pieces, src=0)
        start, stop = split(shape, index)
        parts[name] = received[: stop - start].cpu()
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and not buffer.is_meta:
                moved = buffer.to(ctx.device)
                dist.broadcast(moved, 0)
                module._buffers[name] = moved
    return parts


def to_meta(model: Any) -> None:
    """Replace every parameter by a meta tensor of its shape (tied parameters stay tied); buffers are kept."""
    import torch

    done: dict[int, Any] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is None or param.is_meta:
                continue
            if id(param) not in done:
                done[id(param)] = torch.nn.Parameter(torch.empty_like(param, device="meta"),
                                                     requires_grad=param.requires_grad)
            module._parameters[name] = done[id(param)]


def fill_shards(ctx: sdk.RunContext, model: Any, parts: dict[str, Any]) -> None:
    """After fully_shard on the meta device: allocate the shards on this process's device and copy the parts in."""
    import torch

    buffers = [(m, n, b) for m in model.modules() for n, b in m._buffers.items() if b is not None]
    model.to_empty(device=ctx.device)
    for module, name, buffer in buffers:  # to_empty would leave them uninitialised
        module._buffers[name] = buffer.to(ctx.device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            value = parts.pop(name)  # released as copied: the parts and the shards never coexist whole
            if value.numel() != local.numel():
                raise sdk.AccError(f"parameter {name}: this process holds {local.numel()} element(s) of its shard but "
                                   f"its part has {value.numel()}; the sharding changed between building and prepare")
            local.view(-1).copy_(value.to(local.device, local.dtype))
