"""The names Accelerate users import from `accelerate.utils`, so migrating is changing the import line:
`from accelerate.utils import ProjectConfiguration, set_seed` -> `from acc.utils import ...`.

Importing this module is torch-free; each name imports what it needs when first touched.
"""

from __future__ import annotations

import importlib
from typing import Any

from .kwargs import AutocastKwargs, DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs

_LAZY = {
    "set_seed": ("seed", "set_seed"),
    "ProjectConfiguration": ("checkpoint", "ProjectConfiguration"),
    "send_to_device": ("ops", "send_to_device"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"acc.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'acc.utils' has no attribute {name!r} (acc keeps the accelerate.utils names "
                         f"{', '.join(sorted(__all__))}; the rest of the API is on Accelerator)")


__all__ = ["AutocastKwargs", "DistributedDataParallelKwargs", "GradScalerKwargs", "InitProcessGroupKwargs",
           "ProjectConfiguration", "send_to_device", "set_seed"]
