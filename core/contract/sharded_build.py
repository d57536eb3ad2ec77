"""The interface a sharding backend answers `acc_init_module` with: how a model is built so that no process holds
all of it, and the usual splits of a tensor among processes (FSDP2's dim-0 chunks, ZeRO-3's flat pieces).

Torch-free (tensors are only named in annotations); the meta-device build that fsdp uses is
`acc.runtime.worker.init_module.MetaBuild`.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    import torch

Split = Callable[[tuple[int, ...], int], tuple[int, int]]


class ShardedBuild:
    """What a sharding backend's `acc_init_module` returns (see the module docstring).

    `materializes_meta`: `prepare` may hand this backend models whose parameters are on the meta device (it gives
    them values); otherwise such a model is an error before the backend sees it.
    """

    materializes_meta = False

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """The context the script's model construction runs in."""
        raise NotImplementedError

    def owns(self, param: torch.Tensor) -> bool:
        """Whether `param` was built by this build (so `part`/`store` apply to it)."""
        raise NotImplementedError

    def part(self, param: torch.Tensor) -> tuple[int, int]:
        """The range [start, stop) of the row-major flattened full tensor that this process keeps."""
        raise NotImplementedError

    def store(self, param: torch.Tensor, values: torch.Tensor) -> None:
        """Put `values` (1-D, `stop - start` elements of `part(param)`) in place as this process's part."""
        raise NotImplementedError

    def full_shape(self, param: torch.Tensor) -> tuple[int, ...]:
        """The shape of the whole parameter (a partitioned one may show another)."""
        return tuple(param.shape)

    def has_value(self, param: torch.Tensor) -> bool:
        """Whether this process's part of `param` holds a value already (initialised or loaded)."""
        return True


def dim0_split(world: int) -> Split:
    """The split of torch.chunk along dim 0 into `world` pieces (FSDP2's Shard(0)): (shape, index) -> flat range."""

    def split(shape: tuple[int, ...], index: int) -> tuple[int, int]:
        if not shape:
            return (0, 1) if index == 0 else (1, 1)
        rows = shape[0]
        per = math.ceil(rows / world) if rows else 0
        row_elements = math.prod(shape[1:])
        first, last = min(index * per, rows), min((index + 1) * per, rows)
        return first * row_elements, last * row_elements

    return split


def flat_split(world: int) -> Split:
    """The split of DeepSpeed ZeRO-3 (the flattened tensor cut into `world` equal pieces, the last one short)."""

    def split(shape: tuple[int, ...], index: int) -> tuple[int, int]:
        numel = math.prod(shape)
        per = math.ceil(numel / world)
        return min(index * per, numel), min((index + 1) * per, numel)

    return split


__all__ = ["ShardedBuild", "Split", "dim0_split", "flat_split"]
