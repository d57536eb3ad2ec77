"""Hooks around a module's forward (Accelerate's `accelerate.hooks`): `ModelHook`, `add_hook_to_module`,
`remove_hook_from_module`, the device-alignment and offload hooks. The code is `acc.big_model.module_hooks`, the one
mechanism acc's big-model dispatch uses too; this module hands its names on.
"""

from acc.big_model.casting import LayerwiseCastingHook, attach_layerwise_casting_hooks
from acc.big_model.module_hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    PrefixedDataset,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)

__all__ = [
    "LayerwiseCastingHook", "attach_layerwise_casting_hooks",
    "AlignDevicesHook", "CpuOffload", "ModelHook", "PrefixedDataset", "SequentialHook", "UserCpuOffloadHook",
    "add_hook_to_module", "attach_align_device_hook", "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook", "remove_hook_from_module", "remove_hook_from_submodules",
]
