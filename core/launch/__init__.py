"""Launching: the plan a backend returns, the target script, and one executor per engine.

`acc.launch` is this package and, called, `acc.launchers.launch`: `acc.launch(fn, *args, backend=..., nproc=...,
**settings)` runs a function on every process of a launch (see `acc.launchers`).
"""

import sys
import types
from typing import Any

from acc.contract.launch_plan import ENGINES, LaunchPlan, Rendezvous, Target, elastic_plan

__all__ = ["ENGINES", "LaunchPlan", "Rendezvous", "Target", "elastic_plan"]


class _CallablePackage(types.ModuleType):
    """`acc.launch` is both this package (acc.contract.launch_plan, acc.launch.elastic, ...) and the function that launches
    a function: calling it calls `acc.launchers.launch`."""

    def __call__(self, fn: Any, *args: Any, **settings: Any) -> Any:
        from acc.launchers import launch

        return launch(fn, *args, **settings)


def __getattr__(name: str) -> Any:
    if name == "__wrapped__":  # inspect.signature(acc.launch) and IPython's `acc.launch?` show launch's signature
        from acc.launchers import launch

        return launch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


sys.modules[__name__].__class__ = _CallablePackage
