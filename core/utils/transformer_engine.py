"""Accelerate's `accelerate.utils.transformer_engine` (fp8 through NVIDIA Transformer Engine). acc has no fp8
training yet; `has_transformer_engine_layers` tells whether a model already holds Transformer Engine layers."""

from __future__ import annotations

from typing import Any


def has_transformer_engine_layers(model: Any) -> bool:
    """Whether `model` holds Transformer Engine `LayerNorm`, `Linear` or `TransformerLayer` modules (ImportError
    naming the install when transformer_engine is absent, as in Accelerate)."""
    try:
        import transformer_engine.pytorch as te
    except ImportError:
        raise ImportError("has_transformer_engine_layers needs transformer_engine: pip install "
                          "transformer_engine[pytorch] (NVIDIA GPUs only)") from None
    return any(isinstance(module, (te.LayerNorm, te.Linear, te.TransformerLayer)) for module in model.modules())


__all__ = ["has_transformer_engine_layers"]
