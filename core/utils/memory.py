"""Memory helpers (Accelerate's `accelerate.utils.memory`): retry a function with a smaller batch size on
out-of-memory errors, release objects and the device caches. Torch-free until a device cache exists."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from acc.runtime.devices import clear_device_cache

# substrings of the messages of the errors that mean "this batch does not fit" (Accelerate's list)
OOM_MESSAGES = (
    " out of memory.",  # CUDA, HIP, XPU: "CUDA out of memory. Tried to allocate ..."
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",  # cuDNN refusing a too-large batch
    "DefaultCPUAllocator: can't allocate memory",  # CPU
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
)


def release_memory(*objects: Any) -> list[None]:
    """Drop the references to `objects`, collect garbage and empty the device cache; returns as many Nones
    to assign back: `a, b = release_memory(a, b)`."""
    objects_list = list(objects)
    for i in range(len(objects_list)):
        objects_list[i] = None
    clear_device_cache(garbage_collection=True)
    return objects_list


def should_reduce_batch_size(exception: Exception) -> bool:
    """True for the out-of-memory errors (CUDA, XPU, CPU, HPU, and cuDNN's "not supported") a smaller batch
    may avoid: a RuntimeError (torch.OutOfMemoryError is one) with one argument, the message."""
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        return any(message in str(exception.args[0]) for message in OOM_MESSAGES)
    return False


def find_executable_batch_size(function: Callable | None = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Callable[[], int] | None = None) -> Callable:
    """Decorator: call `function(batch_size, *args, **kwargs)` with `starting_batch_size`, and again after
    each out-of-memory error with a smaller one (x0.9 by default, as Accelerate 1.15, or what
    `reduce_batch_size_fn()` returns), until it runs; RuntimeError when the size reaches zero.

        @find_executable_batch_size(starting_batch_size=128)
        def train(batch_size, model, optimizer):
            ...

        train(model, optimizer)          # the decorator passes batch_size

    Other exceptions pass through. The batch size that worked is kept for later calls.
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    batch_size = starting_batch_size
    if reduce_batch_size_fn is None:

        def reduce_batch_size_fn() -> int:
            return int(batch_size * 0.9)

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            given = ", ".join(f"{name}={value}" for name, value in zip(params[1:], args[1:]))
            raise TypeError(f"Batch size was passed into `{function.__name__}` as the first argument when called. "
                            f"Remove this as the decorator already does so: `{function.__name__}({given})`")
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as exc:
                if not should_reduce_batch_size(exc):
                    raise
                del exc  # the traceback holds the frames (and their tensors) of the failed attempt
                clear_device_cache(garbage_collection=True)
                batch_size = reduce_batch_size_fn()

    return decorator


__all__ = ["clear_device_cache", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"]
