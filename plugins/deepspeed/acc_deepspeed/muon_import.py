"""DeepSpeed's Muon optimizer module imported without compiling its kernels at import.

Every ZeRO engine imports `deepspeed.runtime.zero.muon.muon_optimizer` (to check whether the optimizer is Muon), and
that module decorates three functions with `torch.compile` as it is imported. Decorating alone loads inductor and
its dependencies: 594 modules, 45 MiB and 1.5 s per process, measured here, whatever optimizer the script uses (on
the bench model that was ZeRO-3's peak RSS 803 -> 757 MB per rank). Imported through `import_without_compiling`, the
module's functions are compiled when first called instead: what a Muon user gets is unchanged, and everyone else
never pays for it.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable

MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


def import_without_compiling() -> None:
    """Import DeepSpeed's Muon module with its `torch.compile` decorations deferred to each function's first call;
    nothing when it is imported already (a script that uses Muon imported it itself) or absent."""
    if MODULE in sys.modules:
        return
    try:
        from deepspeed.runtime import compiler
    except ImportError:
        return
    original = compiler.compile
    compiler.compile = lambda: compiled_on_first_call
    try:
        importlib.import_module(MODULE)
    except ImportError:  # a DeepSpeed without Muon: it skips the check the same way
        pass
    finally:
        compiler.compile = original


def compiled_on_first_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.compile(fn)`, made when the function is first called rather than now."""
    compiled: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not compiled:
            import torch

            compiled.append(torch.compile(fn))
        return compiled[0](*args, **kwargs)

    return call
