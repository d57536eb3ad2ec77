"""Accelerate's `accelerate.utils.versions`: version comparisons read from installed metadata (acc's own
objects, `acc.compat.versions`). Torch-free."""

from acc.compat.versions import (  # noqa: F401
    STR_OPERATION_TO_FUNC,
    compare_versions,
    is_torch_version,
)

__all__ = ['STR_OPERATION_TO_FUNC', 'compare_versions', 'is_torch_version']
