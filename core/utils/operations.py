"""Operations on nested structures of tensors (Accelerate's `accelerate.utils.operations`): apply a function
to every tensor, find the batch size, convert to lists or float32. The collectives are acc.Accelerator
methods (and, as free functions, added here by acc.utils when they exist)."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Mapping
from typing import Any, Callable

import torch

from acc.runtime.ops import send_to_device  # noqa: F401  (accelerate.utils.operations.send_to_device)


def is_torch_tensor(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor)


def is_namedtuple(data: Any) -> bool:
    """A tuple with namedtuple's `_asdict` and `_fields`."""
    return isinstance(data, tuple) and hasattr(data, "_asdict") and hasattr(data, "_fields")


def honor_type(obj: Any, generator: Any) -> Any:
    """The items of `generator` in a container of `obj`'s type (list, tuple, namedtuple, ...)."""
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def recursively_apply(func: Callable, data: Any, *args: Any, test_type: Callable[[Any], bool] = is_torch_tensor,
                      error_on_other_type: bool = False, **kwargs: Any) -> Any:
    """`data` with `func(x, *args, **kwargs)` applied to every `x` in it (through lists, tuples and mappings)
    for which `test_type(x)` holds; other objects stay as they are, or with `error_on_other_type` raise
    TypeError."""
    if isinstance(data, (tuple, list)):
        return honor_type(data, (recursively_apply(func, o, *args, test_type=test_type,
                                                   error_on_other_type=error_on_other_type, **kwargs) for o in data))
    if isinstance(data, Mapping):
        return type(data)({k: recursively_apply(func, v, *args, test_type=test_type,
                                                error_on_other_type=error_on_other_type, **kwargs)
                           for k, v in data.items()})
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        raise TypeError(f"Unsupported types ({type(data)}) passed to `{func.__name__}`. Only nested list/tuple/dicts "
                        f"of objects that are valid for `{test_type.__name__}` should be passed.")
    return data


def find_batch_size(data: Any) -> int:
    """Dim 0 of the first tensor in `data` (following the first item of lists/tuples and the first value of
    mappings); ValueError for an empty container, TypeError when it leads to something that is no tensor."""
    if isinstance(data, (tuple, list, Mapping)) and len(data) == 0:
        raise ValueError(f"Cannot find the batch size from empty {type(data)}.")
    if isinstance(data, (tuple, list)):
        return find_batch_size(data[0])
    if isinstance(data, Mapping):
        return find_batch_size(next(iter(data.values())))
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"Can only find the batch size of tensors but got {type(data)}.")
    return data.shape[0]


def ignorant_find_batch_size(data: Any) -> int | None:
    """find_batch_size, or None where it would raise."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def listify(data: Any) -> Any:
    """`data` with every tensor turned into (nested) Python lists of numbers (bf16 through float32)."""

    def to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.to(torch.float32)
        return tensor.tolist()

    return recursively_apply(to_list, data)


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor in `data` (None without one)."""
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (tuple, list)):
        for item in data:
            device = find_device(item)
            if device is not None:
                return device
        return None
    return data.device if isinstance(data, torch.Tensor) else None


def convert_to_fp32(tensor: Any) -> Any:
    """Every float16/bfloat16 tensor in `tensor` converted to float32."""

    def is_half(t: Any) -> bool:
        return (isinstance(t, torch.Tensor) or hasattr(t, "dtype")) and t.dtype in (torch.float16, torch.bfloat16)

    return recursively_apply(lambda t: t.float(), tensor, test_type=is_half)


class ConvertOutputsToFp32:
    """`model_forward` whose float16/bfloat16 outputs come back in float32 (not picklable: unwrap the model
    first)."""

    def __init__(self, model_forward: Callable):
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError("Cannot pickle a prepared model with automatic mixed precision, please unwrap the "
                                   "model with `Accelerator.unwrap_model(model)` before pickling it.")


def convert_outputs_to_fp32(model_forward: Callable) -> Callable:
    """Decorator: the forward's half-precision outputs converted to float32 (`__wrapped__` is the original)."""
    converted = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return converted(*args, **kwargs)

    forward.__wrapped__ = converted  # type: ignore[attr-defined]
    return forward


__all__ = ["copy_tensor_to_devices", "ConvertOutputsToFp32", "convert_outputs_to_fp32", "convert_to_fp32", "find_batch_size", "find_device",
           "honor_type", "ignorant_find_batch_size", "is_namedtuple", "is_torch_tensor", "listify",
           "recursively_apply", "send_to_device"]


# ------------------------------------------------------------------ the collectives, as free functions
# Accelerate's `accelerate.utils` spelling of the collectives: each runs on the current run (the one an
# Accelerator or a PartialState set up; the first call sets one up, as Accelerate's PartialState() does).


def _run() -> Any:
    from acc.runtime.worker import current_or_start

    return current_or_start()


def gather(tensor: Any) -> Any:
    """Every process's tensors concatenated along dim 0 (a 0-d tensor becomes 1-d on several processes)."""
    return _run().gather(tensor)


def gather_object(object: Any) -> Any:  # noqa: A002 - Accelerate's parameter name
    """Every process's picklable object in one flat list (each process's list unpacked one level)."""
    return _run().gather_object(object)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Process `from_process`'s tensors on every process, written into the tensors given."""
    return _run().broadcast(tensor, from_process=from_process)


def copy_tensor_to_devices(tensor: Any = None) -> Any:
    """The main process's tensor on every process's device; the others pass None (they need not know its shape)."""
    import torch

    run = _run()
    if run.num_processes == 1:
        return tensor
    meta = [(tuple(tensor.shape), tensor.dtype) if run.process_index == 0 else None]
    shape, dtype = run.broadcast_object_list(meta, from_process=0)[0]
    if run.process_index != 0:
        tensor = torch.zeros(shape, dtype=dtype, device=run.device)
    return run.broadcast(tensor.to(run.device), from_process=0)


def broadcast_object_list(object_list: list, from_process: int = 0) -> list:
    """Process `from_process`'s list of picklable objects, written into `object_list` on every process."""
    return _run().broadcast_object_list(object_list, from_process=from_process)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce every tensor across processes; the default here is "mean", as in Accelerate's free function."""
    return _run().reduce(tensor, reduction=reduction, scale=scale)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False) -> Any:
    """Pad each tensor along `dim` to the largest size any process has."""
    return _run().pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)


def wait_for_everyone() -> None:
    """Wait until every process of the run reaches this line."""
    _run().wait_for_everyone()


def synchronize_rng_states(rng_types: list, generator: Any = None) -> None:
    """Give every process rank 0's state of each RNG named in `rng_types` ("torch", "cuda", "generator", ...)."""
    from acc.runtime.data.loader import synchronize_rng_states as sync

    run = _run()
    # each state is a byte tensor of one size on every rank: one tensor broadcast, not a pickled object
    sync(list(rng_types), generator, run._broadcast_state if run.num_processes > 1 else (lambda state, src: state))


def synchronize_rng_state(rng_type: Any = None, generator: Any = None) -> None:
    """One RNG's state from rank 0 on every process."""
    synchronize_rng_states([rng_type], generator)


def concatenate(data: list, dim: int = 0) -> Any:
    """Join a list of structures of the same shape (tensors, lists, tuples, dicts) along `dim`; a single
    structure comes back as it is."""
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return type(first)({k: concatenate([d[k] for d in data], dim=dim) for k in first})
    if isinstance(first, torch.Tensor):
        return torch.cat(data, dim=dim)
    if isinstance(data, (tuple, list)) and len(data) == 1:
        return first
    raise TypeError(f"concatenate: can only join tensors (in lists, tuples or dicts), got {type(first).__name__}")


def slice_tensors(data: Any, tensor_slice: Any, process_index: int | None = None,
                  num_processes: int | None = None) -> Any:
    """`data[tensor_slice]` for every tensor in `data`."""
    return recursively_apply(lambda t: t[tensor_slice], data)


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Every tensor of `tensor` padded with zeros along dim 0 (Accelerate's rule for how many rows), so a batch of
    `batch_size` can be split among `num_processes` (e.g. [3, 4, 4] over 4 processes becomes [4, 4, 4])."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        per = batch_size // num_processes
        left = batch_size - per * num_processes
        missing = num_processes - batch_size if per == 0 else num_processes - per
        if left > missing and missing < 1:
            missing = left - missing
        shape = list(t.shape)
        shape[0] = batch_size + missing
        out = t.new_zeros(tuple(shape))
        out[tuple(slice(0, t.shape[dim]) if i == dim else slice(None) for i in range(len(shape)))] = t
        return out

    return recursively_apply(pad, tensor, error_on_other_type=True)


def __getattr__(name: str) -> Any:
    if name in ("CannotPadNestedTensorWarning", "DistributedOperationException"):  # where the collectives are
        from acc.runtime import collectives

        return getattr(collectives, name)
    raise AttributeError(f"module 'acc.utils.operations' has no attribute {name!r}")
