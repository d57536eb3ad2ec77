"""The accelerator devices of this process beyond torch's own: out-of-tree torch backends (torch_npu -> torch.npu,
...) and emptying the caching allocator of the one in use. Reads `sys.modules` and imports a backend's module only
when it is installed.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import sys


def vendor_device(module: str, attr: str, check_device: bool) -> bool:
    """A device of an out-of-tree torch backend (torch_npu -> torch.npu, ...): False when not installed."""
    if importlib.util.find_spec(module) is None:
        return False
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - e.g. torch_npu in a CPU-only container
        return False
    import torch

    backend = getattr(torch, attr, None)
    if backend is None:
        return False
    if check_device:
        try:
            backend.device_count()
        except RuntimeError:
            return False
    return bool(backend.is_available())


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Empty the caching allocator of the accelerator in use (CUDA, XPU, NPU, MLU, MPS); `garbage_collection`
    runs `gc.collect()` first (slow: use sparingly). Nothing to empty when torch was never imported."""
    if garbage_collection:
        gc.collect()
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for name in ("xpu", "npu", "mlu", "musa", "sdaa"):
        backend = getattr(torch, name, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            backend.empty_cache()
            return
    if torch.backends.mps.is_available():
        torch.mps.empty_cache()
    elif torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
