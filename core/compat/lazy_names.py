"""Names a public face hands on from where they live, imported when first touched (PEP 562 `__getattr__`).

A face keeps a table `name -> (module path, attribute)`; its `__getattr__` calls `resolve`, which imports the
module, caches the value in the face's globals (so the next access is a plain lookup) and returns it. The face
stays cheap to import: nothing behind a lazy name is imported until a script asks for it.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping


def resolve(namespace: dict[str, Any], table: Mapping[str, tuple[str, str]], name: str) -> Any:
    """Import `module.attr` for `table[name]`, cache it in `namespace` (a module's globals) and return it."""
    module, attr = table[name]
    value = getattr(importlib.import_module(module), attr)
    namespace[name] = value
    return value
