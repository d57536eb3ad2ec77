"""Accelerate's `accelerate.utils.ao` (fp8 through torchao). acc has no fp8 training yet; `has_ao_layers` tells
whether a model already holds torchao's Float8Linear layers."""

from __future__ import annotations

from typing import Any


def has_ao_layers(model: Any) -> bool:
    """Whether `model` holds torchao `Float8Linear` layers (ImportError naming the install when torchao is absent,
    as in Accelerate)."""
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        raise ImportError("has_ao_layers needs torchao: pip install torchao") from None
    return any(isinstance(module, Float8Linear) for module in model.modules())


__all__ = ["has_ao_layers"]
