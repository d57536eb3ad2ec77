"""Assembling a run: which plugins it loads and what each setting's value is, on both sides of the process boundary.

How a backend is chosen, and every other setting resolved, is `acc.assembly.choose` (read it first): flag >
`ACC_*` environment > cluster environment > project or `--config-file` file > user file > detection > default.
Around it: the plugin manager (`plugins`: discovery from entry points without importing, loading, the checks of a
plugin set), config files (`config_files`), the kernel's own settings and the resolution rule (`settings`),
detection (`detection`, `hardware`: what this machine has, read without torch), cluster environments
(`clusters`), the hand-off to workers (`handoff`: one environment variable that every worker assembles from),
what a run records about itself (`manifest`) and what it never records (`redact`).

Torch-free. Imports `acc.contract`, `acc.compat` and `acc.errors` only; the launcher and the worker runtime build
on it, never the reverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from acc.compat import lazy_names

# acc 0.1's backends (and scripts embedding acc) import these from `acc.assembly`
_LAZY = {
    "Assembly": ("acc.assembly.choose", "Assembly"),
    "assemble": ("acc.assembly.choose", "assemble"),
    "assemble_worker": ("acc.assembly.handoff", "assemble_worker"),
    "LAUNCH_ENV": ("acc.assembly.handoff", "LAUNCH_ENV"),
}

if TYPE_CHECKING:  # pragma: no cover
    from acc.assembly.choose import Assembly, assemble
    from acc.assembly.handoff import LAUNCH_ENV, assemble_worker


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return lazy_names.resolve(globals(), _LAZY, name)
    raise AttributeError(f"module 'acc.assembly' has no attribute {name!r}")


__all__ = ["LAUNCH_ENV", "Assembly", "assemble", "assemble_worker"]
