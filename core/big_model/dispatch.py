"""Loading a checkpoint onto a device map, and the hooks that run a model spread over devices."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from acc.big_model.files import OffloadFolder, TensorRecord, open_checkpoint
from acc.big_model.module_hooks import (
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    _default_device,
    _remove_one,
    add_hook_to_module,
    send_to_device,
)
from acc.big_model.planner import (
    DeviceMapError,
    check_device_map,
    execution_device,
    get_balanced_memory,
    infer_auto_device_map,
    lookup,
)
from acc.big_model.sizes import ModelTensors, _as_dtype
from acc.errors import CheckpointError

logger = logging.getLogger(__name__)

_OFFLOADED = "_acc_offloaded"  # model.__dict__: canonical tensor name -> where an offloaded tensor is kept
_HOOKS = "_acc_hooks"  # model.__dict__: the (module, hook) pairs dispatch_model attached
Source = torch.Tensor | TensorRecord


def _device(place: Any) -> torch.device:
    return torch.device("cuda", place) if isinstance(place, int) else torch.device(place)


def _slot(model: nn.Module, name: str) -> tuple[nn.Module, str, bool]:
    prefix, _, attr = name.rpartition(".")
    module = model.get_submodule(prefix)
    return module, attr, attr in module._parameters


def _get(model: nn.Module, name: str) -> torch.Tensor:
    module, attr, is_param = _slot(model, name)
    return module._parameters[attr] if is_param else module._buffers[attr]


def _set(model: nn.Module, names: list[str], value: torch.Tensor) -> None:
    """Put one tensor under all its (tied) names; parameters stay parameters."""
    old = _get(model, names[0])
    if isinstance(old, nn.Parameter) and not isinstance(value, nn.Parameter):
        value = nn.Parameter(value, requires_grad=old.requires_grad)
    for name in names:
        module, attr, is_param = _slot(model, name)
        (module._parameters if is_param else module._buffers)[attr] = value


def _meta(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=dtype or tensor.dtype, device="meta")


def _check_devices(device_map: dict[str, Any], main: torch.device) -> None:
    places = set(device_map.values()) | ({main.index or 0} if main.type == "cuda" else set())
    gpus = sorted(p for p in places if isinstance(p, int))
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and gpus[-1] >= count:
        raise DeviceMapError(f"the device map uses GPU {gpus[-1]}, but this process sees {count} CUDA device(s); "
                             "place those modules on 'cpu' or 'disk', or pass max_memory without that GPU")
    if ("mps" in places or main.type == "mps") and not torch.backends.mps.is_available():
        raise DeviceMapError("the device map uses 'mps', which is not available in this process")


# ---------------------------------------------------------------------------------------------- loading


def _check_keys(model: nn.Module, tensors: ModelTensors, records: dict[str, TensorRecord], strict: bool,
                where: str, has_values: set[str] = frozenset(),  # type: ignore[assignment]
                shape_of: Any = None) -> None:
    shape_of = shape_of or (lambda name: tuple(_get(model, name).shape))
    missing, loose = [], []
    for names in tensors.groups:
        if any(n in records for n in names):
            continue
        if _get(model, names[0]).is_meta and names[0] not in has_values:
            missing.append(names[0])
        elif tensors.persistent[names[0]]:
            loose.append(names[0])
    unexpected = [k for k in records if k not in tensors.ids]
    for names in tensors.groups:
        record = next((records[n] for n in names if n in records), None)
        if record is not None and shape_of(names[0]) != record.shape:
            raise CheckpointError(f"{where}: '{names[0]}' has shape {list(record.shape)} in the checkpoint, but "
                                  f"{list(shape_of(names[0]))} in the model (another configuration?)")
    hint = _prefix_hint(missing + loose, unexpected)
    if missing or (strict and (loose or unexpected)):
        problems = []
        if missing or loose:
            problems.append(f"{len(missing + loose)} tensor(s) of the model are not in it, e.g. {(missing + loose)[:5]}")
        if unexpected and (strict or hint):
            problems.append(f"{len(unexpected)} of its tensor(s) are not in the model, e.g. {unexpected[:5]}")
        raise CheckpointError(f"{where} does not match {type(model).__name__}: {'; '.join(problems)}{hint}")
    if unexpected:  # logged, as Accelerate logs it
        logger.warning(f"{len(unexpected)} tensor(s) of {where} were not used when initializing "
                       f"{type(model).__name__}: they are not in the model (e.g. {unexpected[:3]}){hint}; pass "
                       "strict=True to make this an error")
    if loose:
        logger.warning(f"{len(loose)} tensor(s) of {type(model).__name__} are not in {where} and keep their values "
                       f"(e.g. {loose[:3]}){hint}; pass strict=True to make this an error")


def _prefix_hint(missing: list[str], unexpected: list[str]) -> str:
    for m in missing[:20]:
        for u in unexpected:
            if u.endswith("." + m):
                return f" (the checkpoint's names start with '{u[: -len(m)]}', which the model's lack)"
            if m.endswith("." + u):
                return f" (the model's names start with '{m[: -len(u)]}', which the checkpoint's lack)"
    return ""


def load_checkpoint_in_model(model: nn.Module, checkpoint: str | Path, device_map: dict[str, Any] | None = None,
                             offload_folder: str | Path | None = None, dtype: torch.dtype | str | None = None,
                             offload_state_dict: bool = False, offload_buffers: bool = False,
                             strict: bool = False) -> None:
    """Load a safetensors checkpoint into `model`, tensor by tensor, each straight onto its device.

    Tensors mapped to "disk" are not read: they stay on the meta device and are later read from the
    checkpoint itself, or, when `dtype` changes them, from a converted copy in `offload_folder`.
    Missing tensors of a meta model and shape mismatches are errors; other mismatches warn unless
    `strict`. (`offload_state_dict` is accepted for compatibility: loading never holds the whole state.)
    """
    tensors = ModelTensors.of(model)
    builds = _builds_of(model)
    if builds:
        return _load_parts(model, tensors, builds, checkpoint, device_map, _as_dtype(dtype), strict)
    device_map = check_device_map(model, device_map or {"": "cpu"}, tensors)
    _check_devices(device_map, torch.device("cpu"))
    dtype = _as_dtype(dtype)
    records = open_checkpoint(checkpoint)
    _check_keys(model, tensors, records, strict, f"checkpoint {checkpoint}")
    if "disk" in device_map.values() and offload_folder is None:
        raise DeviceMapError(f"the device map offloads {[k for k, v in device_map.items() if v == 'disk'][:5]} to "
                             "disk: pass offload_folder=... (a directory for offloaded weights)")
    folder = None
    offloaded: dict[str, Source] = model.__dict__.setdefault(_OFFLOADED, {})
    for names, record, current, target in _held(model, tensors, records, dtype):
        place = lookup(device_map, names[0])
        if place == "disk" and (tensors.is_param[names[0]] or offload_buffers):
            if record.dtype != target:
                folder = folder or OffloadFolder(offload_folder)  # type: ignore[arg-type]
                record = folder.write(names[0], record.read().to(target))
            offloaded[names[0]] = record
            _set(model, names, _meta(current, target))
        else:
            offloaded.pop(names[0], None)
            value = record.read().to(target)
            _set(model, names, value.to(_device(place)) if place not in ("cpu", "disk") else value)
    if folder is not None:
        folder.flush()


def _builds_of(model: nn.Module) -> dict[int, Any]:
    """The parameters of `model` built under `accelerator.init_module()` by a sharding backend, with their build."""
    from acc.runtime.init_module import owner_of
    from acc.runtime.worker import current

    runtime = current()
    builds = getattr(runtime, "builds", None) or []
    if not builds:
        return {}
    found = {}
    for param in model.parameters():
        build = owner_of(param, builds)
        if build is not None:
            found[id(param)] = build
    return found


def _held(model: nn.Module, tensors: ModelTensors, records: dict[str, TensorRecord],
          dtype: torch.dtype | None) -> Iterator[tuple[list[str], TensorRecord, torch.Tensor, torch.dtype]]:
    """Each group of tied tensors the checkpoint holds: its names, its record, the model's tensor now, and the
    dtype to load it as (`dtype` for floating-point tensors, else the tensor's own)."""
    for names in tensors.groups:
        record = next((records[n] for n in names if n in records), None)
        if record is None:
            continue
        current = _get(model, names[0])
        yield names, record, current, dtype if dtype is not None and current.is_floating_point() else current.dtype


def _load_parts(model: nn.Module, tensors: ModelTensors, builds: dict[int, Any], checkpoint: str | Path,
                device_map: Any, dtype: torch.dtype | None, strict: bool) -> None:
    """Load a checkpoint into a model built sharded: each parameter's part that this process keeps is read alone
    (its byte range, never the whole tensor) and stored by its build; buffers (whole on every process) are read
    whole."""
    if device_map not in (None, {"": "cpu"}):
        raise DeviceMapError(f"device_map={device_map!r}: a model built sharded under accelerator.init_module() is "
                             "placed by its backend at prepare(); load it without a device map")
    records = open_checkpoint(checkpoint)

    def shape_of(name: str) -> tuple[int, ...]:
        tensor = _get(model, name)
        build = builds.get(id(tensor))
        return build.full_shape(tensor) if build is not None else tuple(tensor.shape)

    valued = set()  # parameters whose part already holds a value (a stored part, or a real tensor)
    for names in tensors.groups:
        tensor = _get(model, names[0])
        build = builds.get(id(tensor))
        if build is not None and build.has_value(tensor):
            valued.add(names[0])
    _check_keys(model, tensors, records, strict, f"checkpoint {checkpoint}", has_values=valued, shape_of=shape_of)
    for names, record, current, target in _held(model, tensors, records, dtype):
        build = builds.get(id(current))
        if build is None:
            _set(model, names, record.read().to(target))
        else:
            start, stop = build.part(current)
            build.store(current, record.read_range(start, stop).to(target))


# ---------------------------------------------------------------------------------------------- hooks
# acc.hooks ModelHooks (the mechanism of Accelerate's accelerate.hooks), so remove_hook_from_module removes them too


class MaterializeHook(ModelHook):
    """Before the forward: put a module's offloaded tensors on the execution device; after: placeholders back."""

    offload = True  # its module's weights live elsewhere between forwards (acc.big_model.offloaded asks)
    restore_on_detach = True  # remove_hooks (a re-dispatch) turns it off: the tensors then stay on the meta device

    def __init__(self, slots: list[tuple[nn.Module, str, bool, Source]], device: torch.device):
        self.slots, self.execution_device, self.depth = slots, device, 0
        self.placeholders = [(m._parameters if p else m._buffers)[a] for m, a, p, _ in slots]

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        self.depth += 1
        if self.depth > 1:
            return args, kwargs
        loaded: dict[int, torch.Tensor] = {}
        for (owner, attr, is_param, source), placeholder in zip(self.slots, self.placeholders):
            key = id(source)
            if key not in loaded:  # tied slots of one module load once
                value = source.read(self.execution_device) if isinstance(source, TensorRecord) else \
                    source.to(self.execution_device, non_blocking=True)
                loaded[key] = nn.Parameter(value, requires_grad=placeholder.requires_grad) if is_param else value
            (owner._parameters if is_param else owner._buffers)[attr] = loaded[key]
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        self.on_error(module)
        return output

    def on_error(self, module: nn.Module) -> None:  # also when the forward raised: release the weights
        self.depth -= 1
        if self.depth == 0:
            self._release()

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Attached (again, after `add_hook_to_module(..., append=True)` detached it): placeholders in place."""
        if self.depth == 0:
            self._release()
        return module

    def _release(self) -> None:
        for (owner, attr, is_param, _), placeholder in zip(self.slots, self.placeholders):
            (owner._parameters if is_param else owner._buffers)[attr] = placeholder

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Removed by `remove_hook_from_module`: the module's tensors get their values back, in CPU memory (as
        Accelerate's offloading hooks do), so the model runs without the hook."""
        if not self.restore_on_detach:
            return module
        for (owner, attr, is_param, source), placeholder in zip(self.slots, self.placeholders):
            value = source.read() if isinstance(source, TensorRecord) else source.detach().to("cpu")
            (owner._parameters if is_param else owner._buffers)[attr] = \
                nn.Parameter(value, requires_grad=placeholder.requires_grad) if is_param else value
        return module


class _MoveInputs(ModelHook):
    """Before the forward of a device-map entry: its inputs to the device it computes on."""

    def __init__(self, device: torch.device, skip: list[str]):
        self.execution_device, self.skip = device, skip

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device, self.skip)


class _ReturnToInputDevice(ModelHook):
    """On the dispatched model: its output comes back to the device of its first input tensor."""

    def __init__(self, skip: list[str]):
        self.skip, self.seen = skip, []

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        first = next((t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)), None)
        self.seen.append(first.device if first is not None else None)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        device = self.seen.pop()
        return output if device is None else send_to_device(output, device, self.skip)

    def on_error(self, module: nn.Module) -> None:
        self.seen.pop()


def remove_hooks(model: nn.Module) -> None:
    """Remove the hooks `dispatch_model` attached, leaving any other hook of the modules in place (offloaded
    tensors stay on the meta device). `acc.hooks.remove_hook_from_module(model, recurse=True)` removes
    them as well, with every other hook."""
    for module, hook in model.__dict__.pop(_HOOKS, []):
        if isinstance(hook, MaterializeHook):
            hook.restore_on_detach = False
        _remove_one(module, hook)


def dispatch_model(model: nn.Module, device_map: dict[str, Any], main_device: Any = None,
                   state_dict: dict[str, torch.Tensor] | None = None, offload_dir: str | Path | None = None,
                   offload_index: dict | None = None, offload_buffers: bool = False,
                   skip_keys: str | list[str] | None = None, preload_module_classes: list[str] | None = None,
                   force_hooks: bool = False, *, _offload_cpu: bool = False) -> nn.Module:
    """Place a built model per `device_map` and attach the hooks that run it.

    GPU entries move there. With a GPU computing, "cpu" entries stay in CPU memory and are copied to
    the main device (`main_device`, default: the first GPU of the map, else cpu) for their forward;
    "disk" entries are written to `offload_dir` (unless already loaded lazily from a checkpoint) and
    read for their forward. Weights are loaded per module that owns them (a module of a
    `preload_module_classes` class loads its whole subtree at once) and released after its forward.
    Inputs move to each entry's device; the model's output comes back to its input's device.
    `offload_index` (Accelerate's: name -> {"dtype", "shape"} of `<offload_dir>/<name>.dat`, or -> {"safetensors_file",
    "weight_name", "dtype"}) names weights already on disk for tensors left on the meta device.
    """
    remove_hooks(model)
    tensors = ModelTensors.of(model)
    device_map = check_device_map(model, device_map, tensors)
    if offload_index:  # weights already offloaded (by transformers' from_pretrained): read them where they lie
        from acc.big_model.files import index_records

        lying = model.__dict__.setdefault(_OFFLOADED, {})
        for name, record in index_records(offload_dir, dict(offload_index)).items():
            lying.setdefault(name, record)
    main = _device(main_device if main_device is not None else execution_device(device_map.values()))
    if main.type == "cuda" and main.index is None:
        main = torch.device("cuda", 0)
    _check_devices(device_map, main)
    skip = [skip_keys] if isinstance(skip_keys, str) else list(skip_keys or [])
    offloaded: dict[str, Source] = model.__dict__.setdefault(_OFFLOADED, {})
    store: dict[str, Source] = {}
    folder = None
    for names in tensors.groups:
        name = names[0]
        place = lookup(device_map, name)
        current = _get(model, name)
        source = offloaded.get(name) if current.is_meta else current
        if source is None:
            source = next((state_dict[n] for n in names if state_dict and n in state_dict), None)
            if source is None:
                raise CheckpointError(f"'{name}' has no weights (it is on the meta device): load a checkpoint first "
                                      "(load_checkpoint_and_dispatch) or pass state_dict")
        keep = not tensors.is_param[name] and not offload_buffers  # buffers of offloaded modules live on main
        if place == "disk" and not keep:
            if not isinstance(source, TensorRecord):
                if offload_dir is None:
                    raise DeviceMapError(f"the device map puts '{name}' on disk: pass offload_dir=... (a directory "
                                         "for offloaded weights)")
                folder = folder or OffloadFolder(offload_dir)
                source = folder.write(name, source)
            offloaded[name] = store[name] = source
            _set(model, names, _meta(current))
        elif place == "cpu" and (main.type != "cpu" or _offload_cpu) and not keep:
            value = source.read() if isinstance(source, TensorRecord) else source
            offloaded[name] = store[name] = value.detach().to("cpu")
            _set(model, names, _meta(current))
        else:
            value = source.read() if isinstance(source, TensorRecord) else source
            offloaded.pop(name, None)
            _set(model, names, value.to(main if place in ("cpu", "disk") else _device(place)))
    if folder is not None:
        folder.flush()

    plan: dict[str, list[ModelHook]] = {}  # module name -> its hooks, in the order they run
    preload = set(preload_module_classes or [])
    covered: set[str] = set()
    modules = dict(model.named_modules())
    for prefix, module in modules.items():
        if any(c == "" or prefix.startswith(c + ".") for c in covered if c != prefix):
            continue
        base = f"{prefix}." if prefix else ""
        whole = type(module).__name__ in preload
        if whole:
            covered.add(prefix)
            names = [n for n, _ in module.named_parameters(prefix, remove_duplicate=False)]
            names += [n for n, _ in module.named_buffers(prefix, remove_duplicate=False)]
        else:
            names = [base + a for a, t in [*module._parameters.items(), *module._buffers.items()] if t is not None]
        slots = []
        for full in names:
            canonical = tensors.groups[tensors.ids[full]][0]
            if canonical in store:
                owner, attr, is_param = _slot(model, full)
                slots.append((owner, attr, is_param, store[canonical]))
        if slots:
            plan.setdefault(prefix, []).append(MaterializeHook(slots, main))

    computing = {main if p in ("cpu", "disk") else _device(p) for p in device_map.values()}
    if force_hooks or computing != {torch.device("cpu")}:
        for name, place in device_map.items():
            target = main if place in ("cpu", "disk") else _device(place)
            entry = name if name in modules else name.rpartition(".")[0]  # a tensor's entry moves its module's inputs
            plan.setdefault(entry, []).insert(0, _MoveInputs(target, skip))
        plan.setdefault("", []).insert(0, _ReturnToInputDevice(skip))
    attached = []
    for name, hooks in plan.items():
        module = modules[name] if name in modules else model.get_submodule(name)
        hook = hooks[0] if len(hooks) == 1 else SequentialHook(*hooks)
        add_hook_to_module(module, hook, append=True)
        attached.append((module, hook))
    model.__dict__[_HOOKS] = attached
    model.hf_device_map = dict(device_map)
    return model


# ---------------------------------------------------------------------------------------------- entry points


def cpu_offload(model: nn.Module, execution_device: Any = None, offload_buffers: bool = False,
                state_dict: dict[str, torch.Tensor] | None = None,
                preload_module_classes: list[str] | None = None) -> nn.Module:
    """Keep all weights in CPU memory and copy each module's to `execution_device` (default: first GPU,
    else cpu) only for its forward."""
    return dispatch_model(model, {"": "cpu"}, main_device=execution_device or _default_device(),
                          state_dict=state_dict, offload_buffers=offload_buffers,
                          preload_module_classes=preload_module_classes, _offload_cpu=True)


def cpu_offload_with_hook(model: nn.Module, execution_device: int | str | torch.device | None = None,
                          prev_module_hook: UserCpuOffloadHook | None = None) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep `model` in CPU memory and move it whole to `execution_device` (default: first GPU, else Apple's GPU,
    else cpu) at its forward, where it stays until `hook.offload()`. With `prev_module_hook` (what this
    returned for the previous model of a pipeline) that model is offloaded just before this one runs:

        text_encoder, hook_1 = cpu_offload_with_hook(text_encoder, "cuda")
        unet, hook_2 = cpu_offload_with_hook(unet, "cuda", prev_module_hook=hook_1)
        ...                 # unet's first forward sends text_encoder back to the CPU
        hook_2.offload()    # the last model is offloaded by hand

    Returns the model and the hook (`offload()`, `remove()`).
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(model: nn.Module, offload_dir: str | Path, execution_device: Any = None,
                 offload_buffers: bool = False, preload_module_classes: list[str] | None = None) -> nn.Module:
    """Write all weights to `offload_dir` and read each module's for its forward on `execution_device`."""
    return dispatch_model(model, {"": "disk"}, main_device=execution_device or _default_device(),
                          offload_dir=offload_dir, offload_buffers=offload_buffers,
                          preload_module_classes=preload_module_classes)


def load_checkpoint_and_dispatch(model: nn.Module, checkpoint: str | Path, device_map: str | dict | None = None,
                                 max_memory: dict[Any, int | str] | None = None,
                                 no_split_module_classes: list[str] | None = None,
                                 offload_folder: str | Path | None = None, offload_buffers: bool = False,
                                 dtype: torch.dtype | str | None = None, offload_state_dict: bool | None = None,
                                 skip_keys: str | list[str] | None = None,
                                 preload_module_classes: list[str] | None = None, force_hooks: bool = False,
                                 strict: bool = False) -> nn.Module:
    """Load a checkpoint (safetensors file, sharded index, directory, acc checkpoint) onto a device map and
    attach the hooks that run the model across it.

    `device_map` is a dict, or "auto"/"balanced"/"balanced_low_0"/"sequential" to plan one within
    `max_memory` (see `infer_auto_device_map`). Peak host memory stays near what the map keeps in CPU
    memory: tensors are read one at a time and disk entries are read only when their module runs.
    """
    if isinstance(device_map, str):
        modes = ("auto", "balanced", "balanced_low_0", "sequential")
        if device_map not in modes:
            raise DeviceMapError(f"device_map={device_map!r}: use a dict or one of {', '.join(modes)}")
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory, no_split_module_classes, dtype,
                                             low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, max_memory, no_split_module_classes, dtype=dtype)
    load_checkpoint_in_model(model, checkpoint, device_map, offload_folder, dtype, bool(offload_state_dict),
                             offload_buffers, strict)
    if device_map is None:
        return model
    return dispatch_model(model, device_map, offload_dir=offload_folder, offload_buffers=offload_buffers,
                          skip_keys=skip_keys, preload_module_classes=preload_module_classes, force_hooks=force_hooks)
