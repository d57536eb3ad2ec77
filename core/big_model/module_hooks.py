"""Hooks around a module's forward (Accelerate's `accelerate.hooks`, whose public path is `acc.hooks`): the one
mechanism acc's big-model dispatch uses too.

A `ModelHook` gets `pre_forward(module, *args, **kwargs) -> (args, kwargs)` before the module's forward and
`post_forward(module, output) -> output` after it. `add_hook_to_module` replaces the module's `forward`
(the original is kept as `module._old_forward`, the hook as `module._hf_hook`), so the hook runs whether
the module is called or its `forward` is; `remove_hook_from_module` restores it. Hooks that
`acc.big_model.dispatch_model` attaches are ordinary ModelHooks, so `remove_hook_from_module(model,
recurse=True)` (or `remove_hook_from_submodules`) removes them as well.

    from acc.hooks import ModelHook, add_hook_to_module

    class Scale(ModelHook):
        def post_forward(self, module, output):
            return output * 2

    add_hook_to_module(model.head, Scale(), append=True)   # chained after any hook already there

`AlignDevicesHook` moves inputs (and, offloading, the weights) to an execution device for the forward;
`CpuOffload` (through `acc.cpu_offload_with_hook`) keeps a whole model in CPU memory until its forward and
offloads the previous model of a pipeline. A hook may also define `on_error(module)` (an acc addition):
it is called when the forward raises, where `post_forward` is not.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Iterator

import torch
from torch import nn

# attributes Accelerate's dispatch adds to a module's __dict__ (removed with the hook)
_ADDED_ATTRIBUTES = ("to", "cuda", "npu", "xpu", "mlu", "sdaa", "musa")


def _default_device() -> torch.device:
    """The first CUDA device, else Apple's GPU, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _as_device(device: Any) -> torch.device:
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def send_to_device(data: Any, device: Any, skip_keys: str | list[str] | None = None) -> Any:
    """`data` on `device` (acc.runtime.ops.send_to_device); values under `skip_keys` of a mapping stay where they are."""
    from acc.runtime.ops import send_to_device as send

    skip = [skip_keys] if isinstance(skip_keys, str) else list(skip_keys or ())
    if skip and isinstance(data, Mapping):
        moved = {k: v if k in skip else send(v, device) for k, v in data.items()}
        try:
            return type(data)(moved)
        except TypeError:
            return moved
    return send(data, device)


def _find_device(data: Any) -> torch.device | None:
    if isinstance(data, torch.Tensor):
        return data.device
    values = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else ()
    for value in values:
        found = _find_device(value)
        if found is not None:
            return found
    return None


class ModelHook:
    """Callbacks run before and after a module's forward; unlike torch's hooks they receive the kwargs.

    `no_grad = True` runs the forward itself under `torch.no_grad()`.
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is attached."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Called before the forward; returns the (possibly changed) args and kwargs."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after the forward; returns the (possibly changed) output."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run one after the other (in the same order before and after the forward)."""

    def __init__(self, *hooks: ModelHook):
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module

    def on_error(self, module: nn.Module) -> None:
        for hook in self.hooks:
            handler = getattr(hook, "on_error", None)
            if handler is not None:
                handler(module)

    def __repr__(self) -> str:
        return f"SequentialHook({', '.join(map(repr, self.hooks))})"


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook = module._hf_hook
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    try:
        if hook.no_grad:
            with torch.no_grad():
                output = module._old_forward(*args, **kwargs)
        else:
            output = module._old_forward(*args, **kwargs)
    except BaseException:
        handler = getattr(hook, "on_error", None)
        if handler is not None:
            handler(module)
        raise
    return hook.post_forward(module, output)


def _is_graph_module(module: nn.Module) -> bool:
    # replacing a GraphModuleImpl's forward on the instance freezes it; Accelerate sets it on the class
    return "GraphModuleImpl" in str(type(module))


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach `hook` to `module` (in place; the module is returned too).

    A hook already there is replaced, or with `append=True` chained before the new one in a
    `SequentialHook`. `remove_hook_from_module` restores the original forward.
    """
    if append and getattr(module, "_hf_hook", None) is not None:
        old_hook = module._hf_hook
        remove_hook_from_module(module)
        hook = SequentialHook(old_hook, hook)
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        old_forward = module._old_forward  # a hook is replaced: keep the original forward
    else:
        old_forward = module.forward
        module._old_forward = old_forward
    module = hook.init_hook(module)
    module._hf_hook = hook
    forward = functools.update_wrapper(functools.partial(_hooked_forward, module), old_forward)
    if _is_graph_module(module):
        module.__class__.forward = forward
    else:
        module.forward = forward
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Remove the hook `add_hook_to_module` attached (calling its `detach_hook`) and restore the forward;
    with `recurse`, from every submodule too (acc's dispatch hooks included)."""
    if hasattr(module, "_hf_hook"):
        module._hf_hook.detach_hook(module)
        delattr(module, "_hf_hook")
    if hasattr(module, "_old_forward"):
        if _is_graph_module(module):
            module.__class__.forward = module._old_forward
        elif getattr(module._old_forward, "__self__", None) is module and \
                getattr(module._old_forward, "__func__", None) is getattr(type(module), "forward", None):
            module.__dict__.pop("forward", None)  # back to the class's own method (no bound method kept)
        else:
            module.forward = module._old_forward
        delattr(module, "_old_forward")
    for attr in _ADDED_ATTRIBUTES:
        module.__dict__.pop(attr, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of `module` and of all its submodules."""
    remove_hook_from_module(module)
    for child in module.children():
        remove_hook_from_submodules(child)


def _remove_one(module: nn.Module, hook: ModelHook) -> None:
    """Detach `hook` alone from `module`, keeping any other hook chained with it (no init_hook is re-run)."""
    current = getattr(module, "_hf_hook", None)
    if current is hook:
        remove_hook_from_module(module)
    elif isinstance(current, SequentialHook) and any(h is hook for h in current.hooks):
        hook.detach_hook(module)
        rest = tuple(h for h in current.hooks if h is not hook)
        module._hf_hook = rest[0] if len(rest) == 1 else SequentialHook(*rest)


# ---------------------------------------------------------------------------------------------- devices


class PrefixedDataset(Mapping):
    """The entries of `dataset` whose keys start with `prefix`, keyed without it (a lazy view)."""

    def __init__(self, dataset: Mapping, prefix: str):
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter([k[len(self.prefix):] for k in self.dataset if k.startswith(self.prefix)])

    def __len__(self) -> int:
        return sum(1 for k in self.dataset if k.startswith(self.prefix))


class AlignDevicesHook(ModelHook):
    """Puts inputs (and the module's weights) on `execution_device` for the forward.

    With `offload`, the weights live in `weights_map` (by default a CPU copy taken when the hook is
    attached) and on the meta device between forwards: each forward loads them and releases them after.
    `io_same_device` brings the output back to the input's device; `place_submodules` treats the whole
    subtree's tensors (not only the module's own); `skip_keys` are keyword inputs (and output keys) left
    where they are; `tied_params_map` (data pointer -> {device: tensor}) loads a tied weight once per device.
    """

    def __init__(self, execution_device: int | str | torch.device | None = None, offload: bool = False,
                 io_same_device: bool = False, weights_map: Mapping | None = None, offload_buffers: bool = False,
                 place_submodules: bool = False, skip_keys: str | list[str] | None = None,
                 tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None):
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.input_device: torch.device | None = None
        self.original_devices: dict[str, torch.device] = {}
        self.tied_params_names: set[str] = set()
        self.tied_params_map = tied_params_map
        self.tied_pointers_to_remove: set[tuple[int, Any]] = set()

    def __repr__(self) -> str:
        return (f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
                f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
                f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})")

    def _tensors(self, module: nn.Module, include_buffers: bool = True, remove_non_persistent: bool = False) -> list:
        from acc.big_model.tensors import named_module_tensors

        return list(named_module_tensors(module, include_buffers=include_buffers, recurse=self.place_submodules,
                                         remove_non_persistent=remove_non_persistent))

    def init_hook(self, module: nn.Module) -> nn.Module:
        from acc.big_model.tensors import get_non_persistent_buffers, set_module_tensor_to_device

        if self.execution_device is not None and str(self.execution_device) == "meta":
            self.tied_params_map = None  # data pointers of meta tensors are all 0
        if not self.offload and self.execution_device is not None:
            for name, _ in self._tensors(module):
                set_module_tensor_to_device(module, name, self.execution_device, tied_params_map=self.tied_params_map)
        elif self.offload:
            self.original_devices = {name: t.device for name, t in self._tensors(module)}
            if self.weights_map is None:
                self.weights_map = {name: t.to("cpu") for name, t in self._tensors(module, self.offload_buffers)}
            for name, tensor in self._tensors(module, self.offload_buffers, remove_non_persistent=True):
                if self.tied_params_map is not None and tensor.data_ptr() in self.tied_params_map:
                    self.tied_params_names.add(name)
                set_module_tensor_to_device(module, name, "meta")
            if self.execution_device is not None:
                buffers = [n for n, _ in module.named_buffers(recurse=self.place_submodules)] \
                    if not self.offload_buffers else \
                    sorted(get_non_persistent_buffers(module, recurse=self.place_submodules, fqns=True))
                for name in buffers:
                    set_module_tensor_to_device(module, name, self.execution_device,
                                                tied_params_map=self.tied_params_map)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        from acc.big_model.tensors import set_module_tensor_to_device

        if self.io_same_device:
            self.input_device = _find_device([args, kwargs])
        if self.offload:
            self.tied_pointers_to_remove = set()
            for name, _ in self._tensors(module, self.offload_buffers, remove_non_persistent=True):
                value = self.weights_map[name]  # type: ignore[index]
                if self.tied_params_map is not None:
                    if name in self.tied_params_names and value.data_ptr() not in self.tied_params_map:
                        self.tied_params_map[value.data_ptr()] = {}
                    if value.data_ptr() in self.tied_params_map and \
                            self.execution_device not in self.tied_params_map[value.data_ptr()]:
                        self.tied_pointers_to_remove.add((value.data_ptr(), self.execution_device))
                set_module_tensor_to_device(module, name, self.execution_device, value=value,
                                            tied_params_map=self.tied_params_map)
        return (send_to_device(args, self.execution_device),
                send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys))

    def _release(self, module: nn.Module) -> None:
        from acc.big_model.tensors import set_module_tensor_to_device

        for name, _ in self._tensors(module, self.offload_buffers, remove_non_persistent=True):
            set_module_tensor_to_device(module, name, "meta")
        for pointer, device in self.tied_pointers_to_remove:
            self.tied_params_map.get(pointer, {}).pop(device, None)  # type: ignore[union-attr]
        self.tied_pointers_to_remove = set()

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            self._release(module)
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def on_error(self, module: nn.Module) -> None:
        if self.offload:
            self._release(module)

    def detach_hook(self, module: nn.Module) -> nn.Module:
        from acc.big_model.tensors import set_module_tensor_to_device

        if self.offload:
            for name, device in self.original_devices.items():
                if device != torch.device("meta"):
                    set_module_tensor_to_device(module, name, device, value=self.weights_map.get(name))  # type: ignore[union-attr]
        return module


def attach_execution_device_hook(module: nn.Module, execution_device: int | str | torch.device,
                                 skip_keys: str | list[str] | None = None,
                                 preload_module_classes: list[str] | None = None,
                                 tied_params_map: dict | None = None) -> None:
    """An `AlignDevicesHook` (inputs to `execution_device`) on every submodule with tensors and no hook yet."""
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys,
                                                    tied_params_map=tied_params_map))
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(child, execution_device, skip_keys=skip_keys,
                                     preload_module_classes=preload_module_classes, tied_params_map=tied_params_map)


def attach_align_device_hook(module: nn.Module, execution_device: torch.device | None = None, offload: bool = False,
                             weights_map: Mapping | None = None, offload_buffers: bool = False, module_name: str = "",
                             skip_keys: str | list[str] | None = None,
                             preload_module_classes: list[str] | None = None,
                             tied_params_map: dict | None = None) -> None:
    """An `AlignDevicesHook` on every submodule that has tensors of its own (a `preload_module_classes`
    module gets one for its whole subtree); `weights_map` is keyed by full names from `module_name`."""
    from acc.big_model.tensors import named_module_tensors

    full_offload = offload and preload_module_classes is not None and \
        type(module).__name__ in preload_module_classes
    if any(True for _ in named_module_tensors(module)) or full_offload:
        prefixed = PrefixedDataset(weights_map, f"{module_name}." if module_name else "") \
            if weights_map is not None else None
        add_hook_to_module(module, AlignDevicesHook(
            execution_device=execution_device, offload=offload, weights_map=prefixed,
            offload_buffers=offload_buffers, place_submodules=full_offload, skip_keys=skip_keys,
            tied_params_map=tied_params_map), append=True)
    if full_offload:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(child, execution_device=execution_device, offload=offload, weights_map=weights_map,
                                 offload_buffers=offload_buffers,
                                 module_name=f"{module_name}.{child_name}" if module_name else child_name,
                                 skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                                 tied_params_map=tied_params_map)


def attach_align_device_hook_on_blocks(module: nn.Module,
                                       execution_device: torch.device | Mapping[str, Any] | None = None,
                                       offload: bool | Mapping[str, bool] = False, weights_map: Mapping | None = None,
                                       offload_buffers: bool = False, module_name: str = "",
                                       skip_keys: str | list[str] | None = None,
                                       preload_module_classes: list[str] | None = None,
                                       tied_params_map: dict | None = None) -> None:
    """Hooks per block of a device map: `execution_device` and `offload` are one value for the whole
    module or dicts from module names (the blocks) to a device / to whether that block is offloaded."""
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if not offload:
            add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device, io_same_device=True,
                                                        skip_keys=skip_keys, place_submodules=True,
                                                        tied_params_map=tied_params_map))
        else:
            attach_align_device_hook(module, execution_device=execution_device, offload=True,
                                     weights_map=weights_map, offload_buffers=offload_buffers,
                                     module_name=module_name, skip_keys=skip_keys, tied_params_map=tied_params_map)
        return
    if not isinstance(execution_device, Mapping):
        execution_device = {key: execution_device for key in offload}  # type: ignore[union-attr]
    if not isinstance(offload, Mapping):
        offload = {key: offload for key in execution_device}
    if module_name in execution_device and module_name in offload and not offload[module_name]:
        add_hook_to_module(module, AlignDevicesHook(
            execution_device=execution_device[module_name], offload_buffers=offload_buffers,
            io_same_device=module_name == "", place_submodules=True, skip_keys=skip_keys,
            tied_params_map=tied_params_map))
        attach_execution_device_hook(module, execution_device[module_name], skip_keys=skip_keys,
                                     tied_params_map=tied_params_map)
    elif module_name in execution_device and module_name in offload:
        attach_align_device_hook(module, execution_device=execution_device[module_name], offload=True,
                                 weights_map=weights_map, offload_buffers=offload_buffers, module_name=module_name,
                                 skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                                 tied_params_map=tied_params_map)
        if not hasattr(module, "_hf_hook"):
            add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device[module_name],
                                                        io_same_device=module_name == "", skip_keys=skip_keys,
                                                        tied_params_map=tied_params_map))
        attach_execution_device_hook(module, execution_device[module_name],
                                     preload_module_classes=preload_module_classes, skip_keys=skip_keys,
                                     tied_params_map=tied_params_map)
    elif module_name == "":
        add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device.get(""), io_same_device=True,
                                                    skip_keys=skip_keys, tied_params_map=tied_params_map))
    for child_name, child in module.named_children():
        attach_align_device_hook_on_blocks(
            child, execution_device=execution_device, offload=offload, weights_map=weights_map,
            offload_buffers=offload_buffers, module_name=f"{module_name}.{child_name}" if module_name else child_name,
            preload_module_classes=preload_module_classes, skip_keys=skip_keys, tied_params_map=tied_params_map)


# ---------------------------------------------------------------------------------------------- CPU offload


class CpuOffload(ModelHook):
    """Keeps a model in CPU memory until its forward, which moves it to `execution_device` (default: the
    first GPU, else Apple's GPU, else the CPU), where it stays until `init_hook` (`offload()`) is called
    again. `prev_module_hook` (a `UserCpuOffloadHook`) is offloaded just before this model's forward."""

    def __init__(self, execution_device: str | int | torch.device | None = None,
                 prev_module_hook: "UserCpuOffloadHook | None" = None):
        self.prev_module_hook = prev_module_hook
        self.execution_device = _as_device(execution_device) if execution_device is not None else _default_device()

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if isinstance(self.prev_module_hook, UserCpuOffloadHook):
            previous = next(self.prev_module_hook.model.parameters(), None)
            if previous is not None and previous.device != torch.device("cpu"):
                self.prev_module_hook.offload()
                from acc.runtime.devices import clear_device_cache

                clear_device_cache()
        current = next(module.parameters(), None)
        if current is not None and _same_device(current.device, self.execution_device):
            return args, kwargs
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


def _same_device(actual: torch.device, wanted: torch.device) -> bool:
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index)


class UserCpuOffloadHook:
    """What `cpu_offload_with_hook` returns: `offload()` moves the model back to the CPU, `remove()` removes
    the hook."""

    def __init__(self, model: nn.Module, hook: ModelHook):
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)


__all__ = [
    "AlignDevicesHook", "CpuOffload", "ModelHook", "PrefixedDataset", "SequentialHook", "UserCpuOffloadHook",
    "add_hook_to_module", "attach_align_device_hook", "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook", "remove_hook_from_module", "remove_hook_from_submodules",
]
