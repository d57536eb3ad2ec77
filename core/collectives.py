"""The facade's collectives: every one goes through the backend's reduce hooks; the structure handling
(nested data, uneven sizes, padding removal) is kernel code in ops.py."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from . import ops


class CollectivesMixin:
    """Mixed into `Accelerator`; expects `self._pm`, `self.ctx` and the process facts."""

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._pm.hook.acc_all_gather(ctx=self.ctx, tensor=tensor)

    def gather(self, tensor: Any) -> Any:
        """Every process's tensors (nested structures too), concatenated along dim 0 in process order."""
        return ops.gather(tensor, self._all_gather, self.num_processes)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """`gather`, minus the samples that padded the last round, so evaluation sees each sample once."""
        tensors = ops.leaves(input_data)
        if use_gather_object or not tensors:
            data = [x for part in self.gather_object(input_data) for x in (part if isinstance(part, list) else [part])]
        else:
            data = self.gather(input_data)
        loader = self.ctx.loop.active_loader
        if loader is None or not loader.end_of_dataloader or not loader.padded_last_round:
            return data
        keep = loader.real_in_last_round
        if isinstance(data, list) and (use_gather_object or not tensors):
            return data[:keep]
        return ops.slice_batch(data, slice(0, keep))

    def gather_object(self, obj: Any) -> list:
        """A list with every process's (picklable) object, in process order."""
        return self._pm.hook.acc_gather_object(ctx=self.ctx, obj=obj)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce every tensor in `tensor` across processes ("sum", "mean", "max", "min")."""
        if reduction not in ops.REDUCE_OPS:
            raise ValueError(f"reduction {reduction!r} is not one of {', '.join(ops.REDUCE_OPS)}")

        def one(t: torch.Tensor) -> torch.Tensor:
            out = self._pm.hook.acc_all_reduce(ctx=self.ctx, tensor=t.clone(), op=reduction)
            return out * scale if scale != 1.0 else out

        return ops.apply(one, tensor)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        """Process `from_process`'s tensors on every process."""
        return ops.apply(lambda t: self._pm.hook.acc_broadcast(ctx=self.ctx, tensor=t, src=from_process), tensor)

    def broadcast_object(self, obj: Any, from_process: int = 0) -> Any:
        """Process `from_process`'s picklable object on every process."""
        return self._pm.hook.acc_broadcast_object(ctx=self.ctx, obj=obj, src=from_process)[0]

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False) -> Any:
        """Pad each tensor along `dim` to the largest size any process has."""

        def one(t: torch.Tensor) -> torch.Tensor:
            if t.dim() == 0 or dim >= t.dim():
                return t
            sizes = self.gather_object(t.shape[dim])
            return ops.pad_to(t, max(sizes), dim, pad_index, pad_first)

        return ops.apply(one, tensor)

    def wait_for_everyone(self) -> None:
        self._pm.hook.acc_barrier(ctx=self.ctx)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's contiguous share of a list, tuple, tensor or dict of them."""
        yield _split(inputs, self.num_processes, self.process_index, apply_padding)



def _split(inputs: Any, n: int, index: int, apply_padding: bool) -> Any:
    if isinstance(inputs, dict):
        return {k: _split(v, n, index, apply_padding) for k, v in inputs.items()}
    length = len(inputs)
    per, extra = divmod(length, n)
    start = index * per + min(index, extra)
    end = start + per + (1 if index < extra else 0)
    part = inputs[start:end]
    if apply_padding and extra and index >= extra and length:
        last = inputs[-1:] if not isinstance(inputs, torch.Tensor) else inputs[-1:]
        part = torch.cat([part, last]) if isinstance(part, torch.Tensor) else part + last
    return part
