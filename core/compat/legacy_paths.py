"""Module paths of acc 0.1's backend SDK (hook-spec version 1) that now live elsewhere.

A version-1 backend (what `acc new-backend` wrote with acc 0.1) imports `acc.settings`, `acc.communicator`,
`acc.runtime.distributed` and `acc.launch` (for `elastic_plan`) besides `acc` itself. Those modules moved into the role
packages, and `acc.launch` is now a function (`acc.launch(fn)`). So that such a backend still installs, launches and
trains, `install()` (called once by `import acc`) puts one small stand-in module under each old path into
`sys.modules`: importing the old path finds it there, and its names resolve, when first touched, to the objects
where they live now (the same objects, not copies), with a DeprecationWarning that names where they live and the SDK to import instead.
Being in `sys.modules` already, a stand-in is never set as an attribute of `acc`, so `acc.launch` stays the function.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from typing import Any

# old path -> (where its names live now, {name: module} for names that live elsewhere, what to import instead)
MOVED: dict[str, tuple[str | None, dict[str, str], str]] = {
    "acc.settings": ("acc.contract.settings", {"core_settings": "acc.assembly.settings", "resolve": "acc.assembly.settings",
                                               "loop_semantics_settings": "acc.assembly.settings"}, "acc.backend"),
    "acc.communicator": ("acc.contract.communicator", {"TorchDistributed": "acc.runtime.communicators",
                                                        "HookCommunicator": "acc.runtime.communicators"}, "acc.backend"),
    "acc.distributed": ("acc.runtime.distributed", {}, "acc.backend"),
    "acc.launch": (None, {"ENGINES": "acc.contract.launch_plan", "LaunchPlan": "acc.contract.launch_plan",
                          "Rendezvous": "acc.contract.launch_plan", "Target": "acc.contract.launch_plan",
                          "elastic_plan": "acc.launcher.plans"}, "acc.backend"),
}


class MovedModule(types.ModuleType):
    """The stand-in under an old module path: attribute access resolves to the object's new home."""

    def __init__(self, name: str, home: str | None, names: dict[str, str], instead: str):
        super().__init__(name, f"acc 0.1's {name}: moved (names resolve to their new homes; import {instead})")
        self.__dict__["_acc_moved"] = (home, names, instead)

    def __getattr__(self, attr: str) -> Any:
        home, names, instead = self.__dict__["_acc_moved"]
        if attr.startswith("__"):
            raise AttributeError(attr)
        module = names.get(attr, home)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} (acc 0.1's path) has no attribute {attr!r}; "
                                 f"import from {instead}")
        value = getattr(importlib.import_module(module), attr)
        warnings.warn(f"{self.__name__}.{attr} is acc 0.1's path (it lives in {module} now); a backend imports only "
                      f"{instead}, whose __all__ lists what it may use", DeprecationWarning, stacklevel=2)
        return value  # not cached: each use says where the name lives now


def install() -> None:
    """Put the stand-ins into `sys.modules` (idempotent; an old path already imported is left alone)."""
    for name, (home, names, instead) in MOVED.items():
        sys.modules.setdefault(name, MovedModule(name, home, names, instead))


def module(name: str) -> types.ModuleType | None:
    """The stand-in for an old path that `acc` hands out as an attribute (`from acc import distributed`)."""
    return sys.modules.get(name) if name in MOVED else None
