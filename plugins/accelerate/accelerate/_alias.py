"""How `accelerate` becomes acc: its own names forwarded to `acc`, its submodules found as acc's."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import types
from typing import Any


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `accelerate.X` as `acc.X`: the loader hands over the module acc already has (importing it first)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("accelerate."):
            return None
        real = "acc." + fullname[len("accelerate."):]
        try:
            found = real in sys.modules or importlib.util.find_spec(real) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=real)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(str(spec.origin))
        spec.loader_state = getattr(module, "__spec__", None)  # the import system overwrites __spec__; put it back
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        own = module.__spec__.loader_state if module.__spec__ is not None else None
        if own is not None:
            module.__spec__ = own


def become_accelerate(module: types.ModuleType) -> None:
    """Make `module` (the drop-in's `accelerate/__init__`) acc under Accelerate's name, and alias its submodules."""
    import acc
    from acc.compat.dropin import NAME, SAID, describe

    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
    try:
        module.__version__ = importlib.metadata.version(NAME)
    except importlib.metadata.PackageNotFoundError:  # imported from a source tree, not installed
        module.__version__ = f"{acc.__accelerate_version__}+acc.{acc.__version__}"
    module.__all__ = list(acc.__all__)
    module.__getattr__ = lambda name: _attribute(name)  # type: ignore[attr-defined]
    module.__dir__ = lambda: sorted(set(acc.__all__) | set(vars(module)))  # type: ignore[attr-defined]
    if not os.environ.get(SAID) and not os.environ.get("ACC_DROPIN_QUIET"):
        os.environ[SAID] = "1"
        print(f"accelerate: this is {describe()}", file=sys.stderr)


def _attribute(name: str) -> Any:
    import acc
    from acc.compat.dropin import NAME

    if name.startswith("__"):
        raise AttributeError(f"module {NAME!r} has no attribute {name!r}")
    try:
        return getattr(acc, name)
    except AttributeError:
        pass
    try:  # a submodule not imported yet (`accelerate.utils` after a bare `import accelerate`)
        return importlib.import_module(f"{NAME}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {NAME!r} (acc) has no attribute {name!r}") from None


__all__ = ["become_accelerate"]
