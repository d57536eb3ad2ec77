"""The collectives of a run, as one object a backend provides (`acc_communicator`): all of them or none.

Every multi-process backend answers `acc_communicator(ctx)` with a `Communicator`; the kernel builds the
user-facing collectives (nested structures, uneven sizes, Accelerate's shapes) on top of its six methods.
One object instead of six hooks means a backend cannot forget one and silently get the single-process
default: the kernel checks the object has all six, and refuses a multi-process run whose backend answers
with the single-process `LocalCommunicator`.
"""

from __future__ import annotations

import abc
from typing import Any

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


def missing_collectives(communicator: Any) -> list[str]:
    """The Communicator methods `communicator` lacks (an object need not subclass Communicator)."""
    return [name for name in COLLECTIVES if not callable(getattr(communicator, name, None))]


__all__ = ["COLLECTIVES", "Communicator", "LocalCommunicator", "REDUCE_OPS", "missing_collectives"]
