"""Which distribution serves the import name `accelerate`: acc's drop-in (plugins/accelerate, a distribution named
`accelerate` whose version is Accelerate's API level with acc's version as its local label, e.g. `1.15.0+acc.0.1.0`),
Hugging Face Accelerate, or none. `acc env` and the drop-in's first import say it.
"""

from __future__ import annotations

import importlib.metadata

NAME = "accelerate"
SAID = "ACC_DROPIN_SAID"  # set once the first import said which accelerate this is, so workers do not repeat it


def describe() -> str:
    """Which distribution serves `import accelerate` here: acc's drop-in, Hugging Face Accelerate, or none."""
    try:
        version = importlib.metadata.version(NAME)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    if "+acc." not in version:
        return f"Hugging Face Accelerate {version}"
    api, _, acc_version = version.partition("+acc.")
    return (f"acc {acc_version} at Accelerate's API level {api} (the `accelerate` drop-in distribution {version}; "
            f"`pip install --force-reinstall accelerate=={api}` switches back to Hugging Face Accelerate)")


__all__ = ["NAME", "SAID", "describe"]
