"""Version comparisons read from installed metadata, as Accelerate spells them (public path
`acc.utils.versions`). Torch-free."""

from __future__ import annotations

import importlib.metadata
import operator
from typing import Any

STR_OPERATION_TO_FUNC = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
                         "<=": operator.le, "<": operator.lt}


def _parse(version: str) -> Any:
    from packaging.version import parse

    return parse(version)


def compare_versions(library_or_version: Any, operation: str, requirement_version: str) -> bool:
    """`library_or_version <operation> requirement_version`, where the first is an installed distribution's name
    (its version is read from its metadata) or a `packaging.version.Version`; `operation` is one of
    >, >=, ==, !=, <=, <."""
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(f"`operation` must be one of {list(STR_OPERATION_TO_FUNC)}, received {operation}")
    if isinstance(library_or_version, str):
        library_or_version = _parse(importlib.metadata.version(library_or_version))
    return STR_OPERATION_TO_FUNC[operation](library_or_version, _parse(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch's version with `version`, e.g. `is_torch_version(">=", "2.4")`."""
    return compare_versions("torch", operation, version)


__all__ = ["STR_OPERATION_TO_FUNC", "compare_versions", "is_torch_version"]
