"""The names Accelerate users import from `accelerate.utils`, so migrating is changing the import line:
`from accelerate.utils import ProjectConfiguration, set_seed` -> `from acc.utils import ...`.

Importing this module is torch-free; each name imports what it needs when first touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _resolve_lazy
from ..kwargs import AutocastKwargs, DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs

_LAZY = {
    "set_seed": ("seed", "set_seed"),
    "ProjectConfiguration": ("checkpoint", "ProjectConfiguration"),
    "send_to_device": ("ops", "send_to_device"),
}

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import ProjectConfiguration
    from ..ops import send_to_device
    from ..seed import set_seed


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return _resolve_lazy(globals(), _LAZY, name)
    raise AttributeError(f"module 'acc.utils' has no attribute {name!r} (acc keeps the accelerate.utils names "
                         f"{', '.join(sorted(__all__))}; the rest of the API is on Accelerator)")


__all__ = ["AutocastKwargs", "DistributedDataParallelKwargs", "GradScalerKwargs", "InitProcessGroupKwargs",
           "ProjectConfiguration", "send_to_device", "set_seed"]
