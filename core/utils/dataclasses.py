"""The kwargs handlers, configuration objects and enumerations under Accelerate's module path
`accelerate.utils.dataclasses`: acc's own objects, from where they live (`acc.contract.enums`, `acc.contract.kwargs`,
`acc.compat.plugin_objects`, `acc.compat.parallelism_objects`, `acc.compat.recipes`, `acc.checkpointing.files`,
`acc.runtime.ops`). Torch-free to import: each name is imported when first touched."""

from __future__ import annotations

from typing import Any

from acc.compat import lazy_names

_HOMES = {
    "acc.contract.enums": ("BaseEnum", "ComputeEnvironment", "CustomDtype", "DDPCommunicationHookType",
                           "DistributedType", "DynamoBackend", "EnumWithContains", "FP8BackendType", "LoggerType",
                           "PrecisionType", "RNGType", "SageMakerDistributedType"),
    "acc.contract.kwargs": ("AutocastKwargs", "DataLoaderConfiguration", "DistributedDataParallelKwargs",
                            "GradientAccumulationPlugin", "GradScalerKwargs", "InitProcessGroupKwargs", "KwargsHandler"),
    "acc.compat.plugin_objects": ("DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "ProfileKwargs",
                                  "TorchDynamoPlugin"),
    "acc.compat.parallelism_objects": ("DeepSpeedSequenceParallelConfig", "TorchContextParallelConfig",
                                       "TorchTensorParallelConfig"),
    "acc.compat.recipes": ("AORecipeKwargs", "BnbQuantizationConfig", "FP8RecipeKwargs", "MSAMPRecipeKwargs",
                           "MegatronLMPlugin", "TERecipeKwargs", "TorchTensorParallelPlugin"),
    "acc.checkpointing.files": ("ProjectConfiguration",),
    "acc.runtime.ops": ("TensorInformation",),
}
_LAZY = {name: (module, name) for module, names in _HOMES.items() for name in names}


def get_module_class_from_name(module: Any, name: str) -> type | None:
    """The class named `name` among `module` and its submodules (depth first), or None: how a wrap policy given
    by class names (FSDP's transformer_cls_names_to_wrap) finds its classes."""
    if type(module).__name__ == name:
        return type(module)
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return lazy_names.resolve(globals(), _LAZY, name)
    raise AttributeError(f"module 'acc.utils.dataclasses' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = sorted([*_LAZY, "get_module_class_from_name"])
