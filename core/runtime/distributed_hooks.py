"""The collective hooks of every backend built on torch.distributed (ddp, fsdp, deepspeed, the template),
written once. A backend imports them into its plugin module, which makes them its own hook implementations:

    from acc.runtime.distributed_hooks import (acc_all_gather, acc_all_reduce, acc_barrier, acc_broadcast,
                                       acc_broadcast_object, acc_gather_object)

Importing this module does not import torch (each hook imports `acc.runtime.distributed` when called).
"""

from __future__ import annotations

from typing import Any

from acc.contract.context import RunContext
from acc.contract.hookspecs import hookimpl


@hookimpl
def acc_all_reduce(ctx: RunContext, tensor: Any, op: str) -> Any:
    from acc.runtime import distributed

    return distributed.all_reduce(tensor, op)


@hookimpl
def acc_all_gather(ctx: RunContext, tensor: Any) -> Any:
    from acc.runtime import distributed

    return distributed.all_gather(tensor)


@hookimpl
def acc_gather_object(ctx: RunContext, obj: Any) -> list:
    from acc.runtime import distributed

    return distributed.gather_object(obj)


@hookimpl
def acc_broadcast(ctx: RunContext, tensor: Any, src: int) -> Any:
    from acc.runtime import distributed

    return distributed.broadcast(tensor, src)


@hookimpl
def acc_broadcast_object(ctx: RunContext, obj: Any, src: int) -> list:
    from acc.runtime import distributed

    return distributed.broadcast_object(obj, src)


@hookimpl
def acc_barrier(ctx: RunContext) -> bool:
    from acc.runtime import distributed

    return distributed.barrier()
