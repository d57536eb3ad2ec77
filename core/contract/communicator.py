"""The collectives of a run, as one object a backend provides (`acc_communicator`): all of them or none.

Every multi-process backend answers `acc_communicator(ctx)` with a `Communicator`; the kernel builds the
user-facing collectives (nested structures, uneven sizes, Accelerate's shapes) on top of its six methods.
One object instead of six hooks means a backend cannot forget one and silently get the single-process
default: the kernel checks the object has all six, and refuses a multi-process run whose backend answers
with the single-process `LocalCommunicator`.
"""

from __future__ import annotations

import abc
from typing import Any, Callable

COLLECTIVES = ("all_reduce", "all_gather", "gather_object", "broadcast", "broadcast_object", "barrier")
REDUCE_OPS = ("sum", "mean", "max", "min")


class Communicator(abc.ABC):
    """What a backend's processes can do together. Tensors in, tensors out, identical on every process."""

    @abc.abstractmethod
    def all_reduce(self, tensor: Any, op: str) -> Any:
        """`tensor` reduced over every process with `op` (one of REDUCE_OPS; "mean" of integers is float)."""

    @abc.abstractmethod
    def all_gather(self, tensor: Any) -> Any:
        """Equally shaped tensors of every process, concatenated along dim 0 in process order."""

    @abc.abstractmethod
    def gather_object(self, obj: Any) -> list[Any]:
        """One picklable object per process, as a list indexed by process."""

    @abc.abstractmethod
    def broadcast(self, tensor: Any, src: int) -> Any:
        """Process `src`'s tensor (a new tensor, same shape) on every process."""

    @abc.abstractmethod
    def broadcast_object(self, obj: Any, src: int) -> Any:
        """Process `src`'s picklable object on every process (returned as is, None included)."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every process has called it."""


class LocalCommunicator(Communicator):
    """One process: every collective is the identity (the builtin cpu backend's)."""

    def all_reduce(self, tensor: Any, op: str) -> Any:
        return tensor

    def all_gather(self, tensor: Any) -> Any:
        return tensor

    def gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, tensor: Any, src: int) -> Any:
        return tensor

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return obj

    def barrier(self) -> None:
        return None


class TorchDistributed(Communicator):
    """The collectives over torch.distributed's default process group (gloo, nccl, ...): ddp, fsdp, deepspeed
    and third-party backends built on it answer `acc_communicator` with `TorchDistributed()`."""

    def all_reduce(self, tensor: Any, op: str) -> Any:
        from acc import distributed

        return distributed.all_reduce(tensor, op)

    def all_gather(self, tensor: Any) -> Any:
        from acc import distributed

        return distributed.all_gather(tensor)

    def gather_object(self, obj: Any) -> list[Any]:
        from acc import distributed

        return distributed.gather_object(obj)

    def broadcast(self, tensor: Any, src: int) -> Any:
        from acc import distributed

        return distributed.broadcast(tensor, src)

    def broadcast_object(self, obj: Any, src: int) -> Any:
        from acc import distributed

        return distributed.broadcast_object(obj, src)[0]

    def barrier(self) -> None:
        from acc import distributed

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


def missing_collectives(communicator: Any) -> list[str]:
    """The Communicator methods `communicator` lacks (an object need not subclass Communicator)."""
    return [name for name in COLLECTIVES if not callable(getattr(communicator, name, None))]


__all__ = ["COLLECTIVES", "Communicator", "HookCommunicator", "LocalCommunicator", "REDUCE_OPS", "TorchDistributed",
           "missing_collectives"]
