"""Accelerate's `accelerate.utils.bnb` (bitsandbytes 8-bit/4-bit quantization). acc does not quantize models
yet: `get_keys_to_not_convert` and `has_4bit_bnb_layers` work as Accelerate's; the functions that would quantize
raise an error that says so (ImportError naming the install command when bitsandbytes is missing)."""

from __future__ import annotations

import importlib.util
from typing import Any, NoReturn

from acc.errors import AccError


def _refuse(what: str) -> NoReturn:
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError(f"{what} needs bitsandbytes, which is not installed: pip install bitsandbytes (note: acc "
                          "does not quantize models with it yet either)")
    raise AccError(f"{what}: acc does not quantize models with bitsandbytes yet; load the model in bf16/fp16 "
                   "(load_checkpoint_and_dispatch(..., dtype=torch.bfloat16)) or quantize it with bitsandbytes "
                   "directly before acc.prepare")


def load_and_quantize_model(model: Any, bnb_quantization_config: Any, weights_location: Any = None,
                            device_map: Any = None, no_split_module_classes: Any = None, max_memory: Any = None,
                            offload_folder: Any = None, offload_state_dict: bool = False) -> Any:
    """Accelerate's 8-bit/4-bit loading (not in acc yet: an error saying so)."""
    _refuse("load_and_quantize_model")


def get_quantized_model_device_map(model: Any, bnb_quantization_config: Any, device_map: Any = None,
                                   max_memory: Any = None, no_split_module_classes: Any = None) -> Any:
    """Accelerate's device map for a quantized model (not in acc yet: an error saying so)."""
    _refuse("get_quantized_model_device_map")


def replace_with_bnb_layers(model: Any, bnb_quantization_config: Any, modules_to_not_convert: Any = None,
                            current_key_name: Any = None) -> Any:
    """Accelerate's swap of nn.Linear for bitsandbytes layers (not in acc yet: an error saying so)."""
    _refuse("replace_with_bnb_layers")


def get_keys_to_not_convert(model: Any) -> list[str]:
    """The modules to keep in full precision when quantizing: the tied weights' modules and the last child
    (a model's head, e.g. lm_head); none for a base model (it has `base_model_prefix` but not that attribute)
    without tied weights. Names without their `.weight`/`.bias`."""
    from acc.utils.modeling import find_tied_parameters

    tied = [name for group in find_tied_parameters(model) for name in group]
    prefix = getattr(model, "base_model_prefix", None)
    if not tied and prefix is not None and not hasattr(model, prefix):
        return []
    children = [name for name, _ in model.named_children()]
    last = [children[-1]] if children else []
    kept = list(dict.fromkeys(tied)) + [name for name in last if name not in tied]
    return [name.replace(".weight", "").replace(".bias", "") for name in kept]


def has_4bit_bnb_layers(model: Any) -> bool:
    """Whether `model` holds bitsandbytes `Linear4bit` layers (never, when bitsandbytes is not installed)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return False
    import bitsandbytes as bnb

    return any(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


__all__ = ["get_keys_to_not_convert", "get_quantized_model_device_map", "has_4bit_bnb_layers",
           "load_and_quantize_model", "replace_with_bnb_layers"]
