"""Assorted helpers under Accelerate's names (`accelerate.utils.other`): unwrap a prepared model, save and
load on the main process, write a basic config. Torch is imported by the functions that need it."""

from __future__ import annotations

import collections
import functools
import os
import socket
from pathlib import Path
from typing import Any

from acc.logging import get_logger
from acc.runtime.compiling import (  # noqa: F401  (Accelerate's names here)
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    has_repeated_blocks,
    is_repeated_blocks,
)
from acc.runtime.containers import is_compiled_module, optimized_module_class, strip_containers

logger = get_logger(__name__)


def _process_indices() -> tuple[int, int]:
    """(global, local) process index of this process, from the launcher's RANK / LOCAL_RANK (0 without one)."""
    rank = int(os.environ.get("RANK", "0"))
    return rank, int(os.environ.get("LOCAL_RANK", str(rank)))


def _optimized_module_class() -> Any:
    return optimized_module_class()


def has_compiled_regions(module: Any) -> bool:
    """Whether some submodule of `module` was compiled with `torch.compile`."""
    cls = _optimized_module_class()
    return cls is not None and bool(getattr(module, "_modules", None)) and \
        any(isinstance(sub, cls) for sub in module.modules())


def extract_model_from_parallel(model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True,
                                recursive: bool = False) -> Any:
    """The user's model inside its distributed containers: DistributedDataParallel, DataParallel, a DeepSpeed
    engine, FSDP1 (an FSDP2 model is the user's own module already). A `torch.compile`d model is unwrapped
    too and, with `keep_torch_compile`, returned still compiled around the unwrapped model.
    `keep_fp32_wrapper=False` removes the mixed-precision forward (acc's autocast wrapper, or one made with
    `convert_outputs_to_fp32`). `recursive` also unwraps `.module` containers among the submodules."""
    from acc.runtime.precision import Precision

    compiled = None
    if is_compiled_module(model):
        compiled, model = model, model._orig_mod
    elif has_compiled_regions(model) and "_orig_mod" in model.__dict__:
        compiled, model = model, model.__dict__["_orig_mod"]
    model = strip_containers(model)
    if recursive:

        def unwrap(module: Any) -> Any:
            inner = unwrap(module.module) if hasattr(module, "module") else module
            for name, child in list(inner.named_children()):
                setattr(inner, name, unwrap(child))
            return inner

        model = unwrap(model)
    if not keep_fp32_wrapper:
        Precision.unpatch(model)
        original = model.__dict__.pop("_original_forward", None)  # Accelerate's convention
        if original is not None:
            if getattr(original, "__self__", None) is model:
                model.__dict__.pop("forward", None)
            else:
                model.forward = original
    if keep_torch_compile and compiled is not None:
        if is_compiled_module(compiled):
            compiled._orig_mod = model
        else:
            compiled.__dict__["_orig_mod"] = model
        model = compiled
    return model


def clean_state_dict_for_safetensors(state_dict: dict) -> dict:
    """`state_dict` with only the first name of tensors that share memory (a warning names the dropped ones),
    every tensor contiguous: what safetensors can write."""
    import torch

    by_storage: dict[Any, list[str]] = collections.defaultdict(list)
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor):
            by_storage[(tensor.device, tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())] \
                .append(name)
    dropped = [name for names in by_storage.values() if len(names) > 1 for name in names[1:]]
    for name in dropped:
        del state_dict[name]
    if dropped:
        logger.warning(f"Removed shared tensor {set(dropped)} while saving. This should be OK, but check by verifying "
                       "that you don't receive any warning while reloading")
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state_dict.items()}


def _to_cpu_if_xla(obj: Any) -> Any:
    from acc.runtime.ops import apply

    return apply(lambda t: t.cpu() if t.device.type == "xla" else t, obj)


def save(obj: Any, f: Any, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """`torch.save(obj, f)` (or, with `safe_serialization`, a safetensors file of the dict of tensors `obj`) on
    the main process only, or with `save_on_each_node` on each machine's local main process. XLA tensors are
    brought to the CPU first."""
    import torch

    rank, local_rank = _process_indices()
    if (local_rank if save_on_each_node else rank) != 0:
        return
    obj = _to_cpu_if_xla(obj)
    if safe_serialization:
        from safetensors.torch import save_file

        if isinstance(obj, collections.OrderedDict):
            obj = clean_state_dict_for_safetensors(obj)
        save_file(obj, f, metadata={"format": "pt"})
    else:
        torch.save(obj, f)


def _numpy_safe_globals() -> list:
    try:
        import numpy as np
    except ImportError:
        return []
    import codecs

    core = getattr(np, "_core", None) or np.core
    found = [core.multiarray._reconstruct, np.ndarray, np.dtype, codecs.encode]
    found += [cls for cls in vars(getattr(np, "dtypes", object)).values() if isinstance(cls, type)]
    return found


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """`torch.load` with `weights_only=True` unless asked otherwise (so loading never runs code from the
    file); numpy arrays and dtypes (as in RNG states) are allowed."""
    import torch

    kwargs.setdefault("weights_only", True)
    if kwargs["weights_only"]:
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            return torch.load(f, map_location=map_location, **kwargs)
    return torch.load(f, map_location=map_location, **kwargs)


def get_pretty_name(obj: Any) -> str:
    """`obj`'s qualified name, or its class's for an instance."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    if hasattr(obj, "__qualname__"):
        return obj.__qualname__
    if hasattr(obj, "__name__"):
        return obj.__name__
    return str(obj)


def merge_dicts(source: dict, destination: dict) -> dict:
    """Merge `source` into `destination` recursively (in place) and return `destination`."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """`getattr` along a dotted path: `recursive_getattr(model, "encoder.layer.0")`."""
    return functools.reduce(getattr, attr.split("."), obj)


def convert_bytes(size: float) -> str:
    """`size` bytes in the largest unit below 1024 of it, e.g. '1.5 MB'."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on `port` (default 29500) of localhost."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("localhost", 29500 if port is None else port)) == 0


def write_basic_config(mixed_precision: str = "no", save_location: str | os.PathLike | None = None) -> Path | bool:
    """Write acc's config for this machine, as `acc config default` does (the backend and process count that
    detection finds), plus `mixed_precision` ("no", "fp16" or "bf16"), to `save_location` (default: the
    user file, `~/.config/acc/config.toml`, which `acc launch` reads). An existing file is left alone:
    returns False; otherwise the path written."""
    from acc.assembly.choose import detected_config
    from acc.assembly.config_files import CONFIG_HEADER, dump, user_config_path

    path = Path(save_location) if save_location is not None else user_config_path()
    if path.exists():
        print(f"Configuration already exists at {path}, will not override. Run `acc config` manually or pass a "
              "different `save_location`.")
        return False
    mode = str(getattr(mixed_precision, "value", mixed_precision)).lower()
    if mode not in ("no", "fp16", "bf16"):
        raise ValueError(f"`mixed_precision` should be one of 'no', 'fp16' or 'bf16' (acc has no fp8 mode). "
                         f"Received {mixed_precision}")
    top, line = detected_config()  # what `acc config default` writes
    print(f"detected: {line}")
    if mode != "no":
        top["mixed_precision"] = mode
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(top, {}, header=CONFIG_HEADER))
    print(f"wrote {path}")
    return path


def check_os_kernel() -> None:
    """Warn (on the main process) when the Linux kernel is older than 5.5, where processes have been seen to hang."""
    import platform
    import re

    from packaging.version import Version

    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found and Version(found.group(0)) < Version("5.5.0"):
        logger.warning(f"Detected kernel version {found.group(0)}, which is below the recommended minimum of 5.5.0; "
                       "this can cause the process to hang. Upgrade the kernel to 5.5.0 or later.",
                       main_process_only=True)


def get_model_tp_size(model: Any) -> int | None:
    """The tensor-parallel degree a transformers model was sharded with (its `tp_size`, or its config's
    `distributed_config`), None when it was not."""
    size = getattr(model, "tp_size", None)
    if size is not None:
        return size
    config = getattr(getattr(model, "config", None), "distributed_config", None)
    return config.get("tp_size") if isinstance(config, dict) else getattr(config, "tp_size", None)


__all__ = ["check_os_kernel", "clean_state_dict_for_safetensors", "compile_regions", "compile_regions_deepspeed",
           "compile_regions_fsdp2", "has_repeated_blocks", "is_repeated_blocks", "get_model_tp_size", "convert_bytes", "extract_model_from_parallel", "get_pretty_name",
           "has_compiled_regions", "is_compiled_module", "is_port_in_use", "load", "merge_dicts",
           "recursive_getattr", "save", "write_basic_config"]
