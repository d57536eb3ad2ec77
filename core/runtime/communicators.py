"""The communicators acc provides (the protocol is `acc.contract.communicator`): `TorchDistributed`, the collectives
over torch.distributed's default process group, and `HookCommunicator`, a version-1 backend's six collective hooks
seen as one Communicator. Torch-free to import: the collectives import torch when first called.
"""

from __future__ import annotations

from typing import Any, Callable

from acc.contract.communicator import Communicator


class TorchDistributed(Communicator):
    """The collectives over torch.distributed's default process group (gloo, nccl, ...): ddp, fsdp, deepspeed
    and third-party backends built on it answer `acc_communicator` with `TorchDistributed()`."""

    def all_reduce(self, tensor: Any, op: str) -> Any:
        from acc.runtime import distributed

        return distributed.all_reduce(tensor, op)

    def all_gather(self, tensor: Any) -> Any:
        from acc.runtime import distributed

        return distributed.all_gather(tensor)

    def gather_object(self, obj: Any) -> list[Any]:
        from acc.runtime import distributed

        return distributed.gather_object(obj)

    def broadcast(self, tensor: Any, src: int) -> Any:
        from acc.runtime import distributed

        return distributed.broadcast(tensor, src)

    def broadcast_object(self, obj: Any, src: int) -> Any:
        from acc.runtime import distributed

        return distributed.broadcast_object(obj, src)[0]

    def barrier(self) -> None:
        from acc.runtime import distributed

        distributed.barrier()


class HookCommunicator(Communicator):
    """A version-1 backend's six collective hooks seen as a Communicator (its boxed answers unboxed)."""

    def __init__(self, call: Callable[..., Any], ctx: Any):
        self._call, self._ctx = call, ctx

    def all_reduce(self, tensor: Any, op: str) -> Any:
        return self._call("acc_all_reduce", ctx=self._ctx, tensor=tensor, op=op)

    def all_gather(self, tensor: Any) -> Any:
        return self._call("acc_all_gather", ctx=self._ctx, tensor=tensor)

    def gather_object(self, obj: Any) -> list[Any]:
        return list(self._call("acc_gather_object", ctx=self._ctx, obj=obj))

    def broadcast(self, tensor: Any, src: int) -> Any:
        return self._call("acc_broadcast", ctx=self._ctx, tensor=tensor, src=src)

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return self._call("acc_broadcast_object", ctx=self._ctx, obj=obj, src=src)[0]

    def barrier(self) -> None:
        self._call("acc_barrier", ctx=self._ctx)


__all__ = ["HookCommunicator", "TorchDistributed"]
