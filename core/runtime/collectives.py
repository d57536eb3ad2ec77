"""The facade's collectives, with Hugging Face Accelerate's results: every one goes through the backend's
reduce hooks; the structure handling (nested data, uneven sizes, padding removal) is kernel code in ops.py.

Accelerate's shapes: `gather` concatenates along dim 0 (a 0-d tensor becomes 1-d on several processes and stays
as it is on one); `gather_object` returns one flat list of every process's items (each process's list is
unpacked one level; on one process the object itself); `reduce` applies `scale` only on XLA (elsewhere it
warns that it ignores it); `broadcast` writes into the tensors it was given. Tensors that require grad can be
gathered and broadcast: the collective works on their values and returns tensors without history.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import torch

from acc.runtime import ops
from acc.runtime.parallelism import data_parallel_position


class DistributedOperationException(Exception):
    """A collective cannot run because the processes' tensors do not fit together (Accelerate's name); raised by
    the debug-mode checks (`PartialState().debug = True` or ACCELERATE_DEBUG_MODE=1)."""


def debug_checks(ctx: Any) -> bool:
    """Whether the run checks tensor shapes across processes before reduce, broadcast and pad_across_processes
    (Accelerate's debug mode: off unless ACCELERATE_DEBUG_MODE is set or `state.debug = True`)."""
    flag = getattr(ctx, "debug_operations", None)
    if flag is None:
        from acc.compat.environment import parse_flag_from_env

        flag = parse_flag_from_env("ACCELERATE_DEBUG_MODE")
    return bool(flag)


class CollectivesMixin:
    """The user-facing collectives over the run's Communicator (`self.ctx.communicator`); mixed into the Runtime
    and the Accelerator, which share one context."""

    ctx: Any
    num_processes: int
    process_index: int

    def _verify(self, operation: str, tensor: Any, ndim_only: bool = False) -> None:
        """Debug mode: every process passes tensors of one structure and shape (of one number of dimensions for
        pad_across_processes), on the run's device; otherwise DistributedOperationException naming each process's."""
        if self.num_processes == 1 or not debug_checks(self.ctx):
            return
        device = self.ctx.device.type
        wrong = [t.device.type for t in ops.leaves(tensor) if t.device.type != device]
        if wrong:
            raise DistributedOperationException(f"{operation}: one or more tensors are on {wrong[0]}, the run computes "
                                                f"on {device}: move them there first")
        shapes = ops.apply(lambda t: t.dim() if ndim_only else list(t.shape), tensor)
        everyone = self._gather_objects(shapes)
        if any(s != everyone[0] for s in everyone):
            rows = "\n  - ".join(f"Process {i}: {s}" for i, s in enumerate(everyone))
            what = "numbers of dimensions" if ndim_only else "shapes"
            raise DistributedOperationException(f"Cannot apply desired operation due to shape mismatches: the {what} "
                                                f"must be the same on every process.\n\nOperation: `{operation}`\n"
                                                f"Input {what}:\n  - {rows}")

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.ctx.communicator.all_gather(tensor)

    def _gather_objects(self, obj: Any) -> list:
        """Every process's object, one list entry per process, in process order."""
        return self.ctx.communicator.gather_object(obj)

    def _broadcast_object(self, obj: Any, src: int) -> Any:
        return self.ctx.communicator.broadcast_object(obj, src)

    def _broadcast_state(self, state: torch.Tensor, src: int) -> torch.Tensor:
        """Process `src`'s copy of an RNG state (a byte tensor of the same size on every process), as one tensor
        broadcast through the accelerator's device, back where it came from."""
        return self.ctx.communicator.broadcast(state.to(self.device), src).to(state.device)

    def gather(self, tensor: Any) -> Any:
        """Every process's tensors (nested structures too), concatenated along dim 0 in process order."""
        if self.num_processes == 1:
            return tensor
        return ops.gather(ops.apply(lambda t: t.detach(), tensor), self._all_gather, self.num_processes)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """`gather`, minus the samples added to even out the last round, so evaluation sees each sample once."""
        world = self.num_processes
        group = self._replica_group()
        if use_gather_object or not ops.all_tensors(input_data):
            if world == 1:
                data = input_data
            else:  # one copy per tp group (its ranks, consecutive, saw the same samples)
                data = flatten_one_level(self._gather_objects(input_data)[::group])
            use_gather_object = True
        else:
            data = self.gather(input_data)
            if group > 1:
                data = ops.apply(lambda t: t.reshape(world, -1, *t.shape[1:])[::group].reshape(-1, *t.shape[1:]), data)
        loop = self.ctx.loop
        if not loop.end_of_dataloader:
            return data
        keep = loop.remainder
        if keep <= 0:  # -1: the data had no length (nothing to drop that acc knows of); 0: nothing was added
            return data
        if use_gather_object:
            return data[:keep]
        return ops.apply(lambda t: t[:keep], data)

    def _replica_group(self) -> int:
        """How many consecutive ranks read the same batches (a tp group's; 1 without a tp dim)."""
        world = self.num_processes
        return world // data_parallel_position(self.ctx.parallelism, 0, world)[0]

    def gather_object(self, obj: Any) -> Any:
        """Every process's picklable object in one flat list (a list from each process is unpacked one level);
        on one process, the object itself."""
        if self.num_processes == 1:
            return obj
        return flatten_one_level(self._gather_objects(obj))

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce every tensor in `tensor` across processes: "sum", "mean", "max" (and acc's "min").

        On a mesh with a tp dim, "sum" counts each tp group once (its ranks read the same batches, as
        gather_for_metrics keeps one copy per group); Accelerate sums every rank there. As in Accelerate, `scale`
        is applied on XLA only (elsewhere a warning says it was ignored) and
        "none" sums, as Accelerate 1.15 does on every multi-process backend (its documentation says "no
        operation"); on one process every reduction returns a copy.
        """
        if reduction not in ops.REDUCE_OPS + ("none",):
            raise ValueError(f"reduction {reduction!r} is not one of {', '.join(ops.REDUCE_OPS + ('none',))}")
        self._verify("reduce", tensor)
        if scale != 1.0 and not self._scale_applies():
            warnings.warn(f"reduce(scale={scale}) is ignored, as Accelerate ignores it except on XLA; multiply the "
                          "result instead", stacklevel=2)
        if self.num_processes == 1:
            return ops.apply(lambda t: t.clone(), tensor)
        op = "sum" if reduction == "none" else reduction
        apply_scale = scale != 1.0 and self._scale_applies()
        group = self._replica_group()

        def one(t: torch.Tensor) -> torch.Tensor:
            if op == "sum" and group > 1:  # one copy per tp group: its ranks hold the same samples' values
                every = self._all_gather(t.detach().clone().reshape(1, *t.shape))
                out = every[::group].sum(0, dtype=t.dtype)
            else:  # mean, max and min over identical copies are theirs over the data-parallel ranks already
                out = self.ctx.communicator.all_reduce(t.detach().clone(), op)
            return out * scale if apply_scale else out

        return ops.apply(one, tensor)

    def _scale_applies(self) -> bool:
        return str(getattr(self.distributed_type, "value", self.distributed_type)).upper().startswith("XLA")

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        """Process `from_process`'s tensors on every process, written into the tensors given (returned)."""
        if self.num_processes == 1:
            return tensor
        self._verify("broadcast", tensor)

        def one(t: torch.Tensor) -> torch.Tensor:
            out = self.ctx.communicator.broadcast(t.detach(), from_process)
            with torch.no_grad():
                t.copy_(out)
            return t

        return ops.apply(one, tensor)

    def broadcast_object(self, obj: Any, from_process: int = 0) -> Any:
        """Process `from_process`'s picklable object on every process (acc's)."""
        if self.num_processes == 1:
            return obj
        return self._broadcast_object(obj, from_process)

    def broadcast_object_list(self, object_list: list, from_process: int = 0) -> list:
        """Process `from_process`'s list on every process, written into `object_list` (returned)."""
        if self.num_processes > 1:
            object_list[:] = self._broadcast_object(list(object_list), from_process)
        return object_list

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False) -> Any:
        """Pad each tensor along `dim` to the largest size any process has (tensors without that dim unchanged)."""
        self._verify("pad_across_processes", tensor, ndim_only=True)

        def one(t: torch.Tensor) -> torch.Tensor:
            if getattr(t, "is_nested", False):
                warnings.warn("pad_across_processes: a nested tensor cannot be padded; it is returned as it is",
                              CannotPadNestedTensorWarning, stacklevel=4)
                return t
            if not -t.dim() <= dim < t.dim():
                return t
            axis = dim % t.dim()
            sizes = self._gather_objects(t.shape[axis]) if self.num_processes > 1 else [t.shape[axis]]
            return ops.pad_to(t, max(sizes), axis, pad_index, pad_first)

        return ops.apply(one, tensor)

    def wait_for_everyone(self) -> None:
        self.ctx.communicator.barrier()

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's contiguous share of a list, tuple, tensor, `datasets.Dataset` or dict of them."""
        yield split(inputs, self.num_processes, self.process_index, apply_padding)


class CannotPadNestedTensorWarning(UserWarning):
    """`pad_across_processes` was given a nested tensor, which has no size to pad to: it comes back unchanged."""


def flatten_one_level(parts: list) -> list:
    """Accelerate's gather_object result: the items of each process's list (or the object itself), in order."""
    out: list = []
    for part in parts:
        if isinstance(part, (list, tuple)):
            out.extend(part)
        else:
            out.append(part)
    return out


def split(inputs: Any, n: int, index: int, apply_padding: bool) -> Any:
    """Process `index`'s contiguous share of `inputs` (the first `len % n` processes get one more)."""
    if n == 1:
        return inputs
    if isinstance(inputs, dict):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError(f"split_between_processes: all values of the dict must have the same length, got "
                             f"{ {k: len(v) for k, v in inputs.items()} }")
        return {k: split(v, n, index, apply_padding) for k, v in inputs.items()}
    length = len(inputs)
    per, extra = divmod(length, n)
    start = index * per + min(index, extra)
    end = start + per + (1 if index < extra else 0)
    target = per + (1 if extra else 0)
    if callable(getattr(inputs, "select", None)) and not isinstance(inputs, (list, tuple, torch.Tensor)):
        rows = list(range(min(start, length), min(end, length)))  # a datasets.Dataset stays a Dataset
        if apply_padding and length:
            rows += [length - 1] * (target - len(rows))
        return inputs.select(rows)
    part = inputs[start:end]
    if apply_padding and length and len(part) < target:
        missing = target - len(part)
        if isinstance(part, torch.Tensor):
            part = torch.cat([part, inputs[-1:].expand(missing, *inputs.shape[1:])])
        else:
            part = part + type(part)([inputs[-1]] * missing)
    return part
