"""Big-model inference: build without memory, plan placement, load memory-mapped, run across devices.

    from acc.big_model import init_empty_weights, load_checkpoint_and_dispatch

    with init_empty_weights():
        model = MyModel(config)                      # parameters on the meta device: nothing allocated
    model = load_checkpoint_and_dispatch(model, "ckpt_dir", device_map="auto",
                                         max_memory={0: "20GiB", "cpu": "60GiB"}, offload_folder="offload",
                                         no_split_module_classes=["Block"])

Names and arguments follow Accelerate's, so code written for it keeps working. A device map maps
module (or tensor) names to a GPU index, "cpu" or "disk"; the longest matching name wins. Modules
placed on "cpu" while a GPU computes, and modules placed on "disk", keep their weights off the
execution device: a hook loads them just in time for the module's forward and releases them after it.
The hooks are `acc.hooks` ModelHooks (Accelerate's mechanism): `acc.hooks.remove_hook_from_module(model,
recurse=True)` removes them, `remove_hooks(model)` removes only these. `cpu_offload_with_hook` moves a
whole model to the execution device at its forward (diffusers' model CPU offload).

`acc.big_modeling` is this module under Accelerate's name. `estimate` holds what `acc estimate-memory` and
Accelerate's `estimate_command` compute for a model built on the meta device.

Imports the worker runtime (`acc.runtime`), the checkpoint files (`acc.checkpointing`) and the contract;
`acc.hooks` and `acc.big_modeling` are Accelerate's faces over it, and `acc.utils.modeling` hands on its names.
"""

from __future__ import annotations

from acc.big_model.casting import LayerwiseCastingHook, attach_layerwise_casting_hooks
from acc.big_model.dispatch import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    remove_hooks,
)
from acc.big_model.files import read_safetensors_index
from acc.big_model.module_hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from acc.big_model.planner import (
    DeviceMap,
    DeviceMapError,
    check_device_map,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
)
from acc.big_model.sizes import compute_module_sizes, largest_unit, parse_memory
from acc.compat.parallelism_objects import (
    refuse_recurrent_layers_under_sequence_parallelism as _refuse_recurrent_layers_under_sequence_parallelism,  # noqa: F401  (Accelerate's private name, imported by its tests)
)
from acc.runtime.empty_weights import init_empty_weights, init_on_device

__all__ = [
    "AlignDevicesHook", "CpuOffload", "ModelHook", "SequentialHook", "UserCpuOffloadHook", "add_hook_to_module",
    "attach_align_device_hook", "attach_align_device_hook_on_blocks", "attach_execution_device_hook",
    "cpu_offload_with_hook", "remove_hook_from_module", "remove_hook_from_submodules",
    "DeviceMap", "DeviceMapError", "check_device_map", "compute_module_sizes", "cpu_offload", "disk_offload",
    "dispatch_model", "get_balanced_memory", "get_max_memory", "infer_auto_device_map", "init_empty_weights",
    "init_on_device", "largest_unit", "load_checkpoint_and_dispatch", "load_checkpoint_in_model", "parse_memory",
    "read_safetensors_index", "remove_hooks", "LayerwiseCastingHook", "attach_layerwise_casting_hooks",
]
