"""torch.distributed, once: process-group setup and the collectives, for every backend built on it.

Backends (ddp, fsdp, deepspeed, third parties) answer their setup and reduce hooks with these functions,
so the logic exists in one place and the backends do not import each other.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from acc.contract.context import ProcessInfo, RunContext
from acc.errors import AccError

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launcher_facts(backend_name: str) -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from the variables a launcher sets."""
    missing = [v for v in LAUNCHER_VARS if v not in os.environ]
    if missing:
        raise AccError(
            f"backend '{backend_name}' runs processes started by a launcher, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set in this process; start the script with "
            f"`acc launch --backend {backend_name} --nproc N script.py` (or torchrun with ACC_BACKEND={backend_name})"
        )
    world = int(os.environ["WORLD_SIZE"])
    return (int(os.environ["RANK"]), world, int(os.environ["LOCAL_RANK"]),
            int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def choose_device(ctx: RunContext, local_rank: int) -> torch.device:
    """cuda:<local rank> when CUDA is usable and not refused with `cpu`, else the CPU."""
    if not ctx.settings["cpu"] and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise AccError(
                f"local rank {local_rank} has no CUDA device: only {count} visible on this machine; "
                f"use --nproc {count} (one process per device) or --cpu"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_process_group(ctx: RunContext, backend_name: str, pg_backend: str = "auto",
                       distributed_type: str | None = None) -> ProcessInfo:
    """Join (or reuse) the default process group; returns this process's ProcessInfo.

    `pg_backend` "auto" is nccl on CUDA devices and gloo on the CPU. The user's `InitProcessGroupKwargs`
    (backend, init_method; its timeout is already in `ctx.settings["timeout"]`) override it on every backend.
    """
    from acc.contract.kwargs import InitProcessGroupKwargs

    rank, world, local_rank, local_world = launcher_facts(backend_name)
    device = choose_device(ctx, local_rank)
    override = ctx.handler(InitProcessGroupKwargs)
    if override is not None and override.backend:
        pg_backend = override.backend
    if pg_backend == "auto":
        pg_backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=ctx.settings["timeout"])}
        if device.type == "cuda":
            kwargs["device_id"] = device
        store = _restart_store(world, kwargs["timeout"])
        if store is not None:
            kwargs["store"] = store
        elif override is not None and override.init_method:
            kwargs["init_method"] = override.init_method
        dist.init_process_group(backend=pg_backend, rank=rank, world_size=world, **kwargs)
    # as Accelerate: a launched CUDA process is MULTI_GPU whatever the world size; CPU processes are MULTI_CPU when
    # there are several, NO when one runs alone
    label = distributed_type or ("MULTI_GPU" if device.type == "cuda" else "MULTI_CPU" if world > 1 else "NO")
    return ProcessInfo(device=device, num_processes=world, process_index=rank, local_process_index=local_rank,
                       local_num_processes=local_world, distributed_type=label,
                       process_group_backend=dist.get_backend())


def _restart_store(world: int, timeout: datetime.timedelta) -> Any:
    """For a restarted round under the elastic agent, the agent's store with a per-attempt prefix.

    torch (2.13) assumes a new agent store per retry, but the c10d rendezvous keeps one, so a restarted
    round reads the previous round's gloo addresses and fails to connect ("connectFullMesh ... Connection
    refused"; reproduced with plain torchrun --max-restarts 1). None on a first round or without the agent.
    """
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                           timeout=timeout)
    return dist.PrefixStore(f"acc/attempt_{attempt}/", client)


def destroy_process_group(timeout: float) -> None:
    """Leave the group once every rank got here (waiting at most `timeout` seconds; on gloo a rank that
    does not arrive is named). Destroying it while a peer still talks aborts gloo at exit: seen in 5 of
    30 stressed 2-process runs without the barrier, 0 of 30 with it."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo":
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout))
    else:
        dist.barrier()
    dist.destroy_process_group()


_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def all_reduce(tensor: torch.Tensor, op: str) -> torch.Tensor:
    """Reduce across the world; "mean" is a sum divided by the world size (gloo has no AVG)."""
    out = tensor if tensor.is_contiguous() else tensor.contiguous()
    if op == "mean":
        if not (out.is_floating_point() or out.is_complex()):
            out = out.to(torch.float32)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / dist.get_world_size()
    dist.all_reduce(out, op=_OPS[op])
    return out


def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Equal-shaped tensors from every rank, concatenated along dim 0 in rank order."""
    world = dist.get_world_size()
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bool:  # not every backend gathers bools
        return all_gather(tensor.to(torch.uint8)).to(torch.bool)
    out = tensor.new_empty((world * tensor.shape[0], *tensor.shape[1:]))
    _gather_single(out, tensor)
    return out


# torch >= 2.13 names it all_gather_single (the old name warns, and aborts gloo at exit)
_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather_object(obj: Any) -> list:
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:
    out = tensor.clone().contiguous()
    dist.broadcast(out, src=src)
    return out


def broadcast_object(obj: Any, src: int) -> list:
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box


def barrier() -> bool:
    dist.barrier()
    return True


# ------------------------------------------------------------------ point-to-point all-gather and reduce-scatter
# On gloo (CPU, 2 processes, 12.5 MB per process) the same bytes moved as an isend/irecv with each peer took 10 ms
# for an all-gather against gloo's own 40 ms, and 13-15 ms for a reduce-scatter (then summed locally in rank order)
# against gloo's all-reduce-volume 41 ms (bench/sharded_floor.py). fsdp and deepspeed both use these on gloo.
P2P_ALL_GATHER_TAG, P2P_REDUCE_SCATTER_TAG = 0x0AC1, 0x0AC2  # the two collectives' messages never match each other


class P2PWorks(dist.Work):
    """Several point-to-point works waited as one (what a caller of an asynchronous collective waits on)."""

    def __init__(self, works: list[Any]):
        super().__init__()
        self._works = works

    def wait(self, timeout: Any = None) -> bool:
        for work in self._works:
            work.wait()
        self._works = []
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)


def _exchange(group: Any, tag: int, sends: dict[int, torch.Tensor], receives: dict[int, torch.Tensor]) -> list[Any]:
    """Post an isend of sends[p] and an irecv into receives[p] for every peer p (group ranks); the works."""
    works = []
    for peer in sends:
        works.append(dist.isend(sends[peer], group=group, group_dst=peer, tag=tag))
        works.append(dist.irecv(receives[peer], group=group, group_src=peer, tag=tag))
    return works


def p2p_all_gather_into(output: torch.Tensor, input: torch.Tensor, group: Any = None,
                        async_op: bool = False) -> P2PWorks | None:
    """all_gather_into_tensor as an isend of this process's `input` to each peer and an irecv of theirs: `output`
    (contiguous, world x input's size) holds every process's input in rank order. With `async_op` the works to wait
    on; the input may be this process's chunk of the output already (an in-place all-gather)."""
    group = group if group is not None else dist.group.WORLD
    world, rank, n = group.size(), group.rank(), input.numel()
    chunks = output.view(world, n)
    flat = input.reshape(-1)
    if chunks[rank].data_ptr() != flat.data_ptr():
        chunks[rank].copy_(flat)
    peers = [p for p in range(world) if p != rank]
    works = P2PWorks(_exchange(group, P2P_ALL_GATHER_TAG, {p: flat for p in peers}, {p: chunks[p] for p in peers}))
    if async_op:
        return works
    works.wait()
    return None


def p2p_reduce_scatter_sum(output: torch.Tensor, input: torch.Tensor, group: Any = None,
                           async_op: bool = False) -> P2PWorks | None:
    """reduce_scatter_tensor with SUM as point-to-point messages: chunk p of `input` (world equal chunks) goes to
    peer p, and `output` becomes the sum of every process's chunk of this rank, added in rank order. Synchronous:
    with `async_op` the works returned are complete already."""
    group = group if group is not None else dist.group.WORLD
    world, rank = group.size(), group.rank()
    chunks = input.view(world, -1)
    peers = [p for p in range(world) if p != rank]
    flat_output = output.view(-1)
    if world == 2 and not _overlap(flat_output, input):
        # the peer's chunk lands in `output`, and one addition adds this process's own: a + b is b + a bitwise,
        # so this is the rank-order sum, without a buffer of the chunk's size
        for work in _exchange(group, P2P_REDUCE_SCATTER_TAG, {peers[0]: chunks[peers[0]]}, {peers[0]: flat_output}):
            work.wait()
        flat_output.add_(chunks[rank])
        return P2PWorks([]) if async_op else None
    stacked = torch.empty_like(chunks)  # output may be a chunk of the input (in place): every chunk received apart
    stacked[rank].copy_(chunks[rank])
    for work in _exchange(group, P2P_REDUCE_SCATTER_TAG, {p: chunks[p] for p in peers}, {p: stacked[p] for p in peers}):
        work.wait()
    torch.sum(stacked, dim=0, out=flat_output)
    return P2PWorks([]) if async_op else None


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of two contiguous tensors overlaps."""
    a_start, b_start = a.data_ptr(), b.data_ptr()
    return a_start < b_start + b.numel() * b.element_size() and b_start < a_start + a.numel() * a.element_size()
