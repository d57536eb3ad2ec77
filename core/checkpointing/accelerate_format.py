"""Checkpoints Hugging Face Accelerate's `save_state` wrote, read by acc's `load_state` without running code.

Accelerate's layout (one directory): `model.safetensors` or `pytorch_model.bin` (`_1`, `_2`, ... for further
models), `optimizer.bin`, `scheduler.bin`, `scaler.pt`, `random_states_<rank>.pkl` (the step and the Python,
NumPy and torch generator states), `custom_checkpoint_<i>.pkl` (registered objects). Every torch file is read with
`torch.load(weights_only=True)`, which builds only tensors and plain data; the NumPy generator state needs NumPy's
array types, which are allowed for that file alone. A file holding anything else is refused, naming it (Accelerate
reads registered objects with weights_only=False, which runs code from the file; acc does not). Data-loader
positions (`dl_state_dict.bin`, Accelerate's StatefulDataLoader state) are not read: the loaders start their epoch
afresh, as Accelerate's do without `use_stateful_dataloader`.
"""

from __future__ import annotations

import pickle
import random
import warnings
from pathlib import Path
from typing import Any

import torch

from acc.errors import CheckpointError

MANIFEST = "manifest.json"


def is_accelerate_checkpoint(directory: Path) -> bool:
    """A directory Accelerate's save_state wrote: no acc manifest, and Accelerate's random-state or model files."""
    if not directory.is_dir() or (directory / MANIFEST).exists():
        return False
    return any(directory.glob("random_states_*.pkl")) or (directory / "model.safetensors").exists() or \
        (directory / "pytorch_model.bin").exists()


def _numpy_types() -> list[Any]:
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    kinds = [core.multiarray._reconstruct, np.ndarray, np.dtype]
    kinds += [getattr(np.dtypes, name) for name in ("UInt32DType", "Float64DType", "Int64DType")
              if hasattr(getattr(np, "dtypes", None), name)]
    return kinds


def load(path: Path, map_location: Any = "cpu", numpy: bool = False) -> Any:
    """`path` read as tensors and plain data (and NumPy arrays with `numpy`); anything else is refused."""
    try:
        if numpy:
            with torch.serialization.safe_globals(_numpy_types()):
                return torch.load(path, map_location=map_location, weights_only=True)
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{path}: refused: this file of an Accelerate checkpoint holds Python objects other than "
                              "tensors and plain data, and loading them would run code from the file "
                              f"({str(exc).splitlines()[0]}); save that object's state as tensors and plain data "
                              "(its state_dict) to load it with acc") from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot be read: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None


def _model_state(directory: Path, index: int) -> dict[str, torch.Tensor]:
    ending = f"_{index}" if index else ""
    safe = directory / f"model{ending}.safetensors"
    if safe.exists():
        from safetensors.torch import load_file

        return load_file(str(safe))
    binary = directory / f"pytorch_model{ending}.bin"
    if binary.exists():
        return load(binary)
    raise CheckpointError(f"{directory}: Accelerate checkpoint without weights for model #{index} (neither "
                          f"{safe.name} nor {binary.name}); prepare the same models as when it was saved")


def _required(path: Path, what: str) -> Path:
    if not path.exists():
        raise CheckpointError(f"{path.parent}: Accelerate checkpoint without {path.name} for {what}; prepare the same "
                              "objects as when it was saved")
    return path


def _set_rng(states: dict[str, Any]) -> None:
    random.setstate(states["random_state"])
    if "numpy_random_seed" in states:
        import numpy as np

        np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    if "torch_cuda_manual_seed" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["torch_cuda_manual_seed"])


def load_accelerate_checkpoint(directory: Path, *, models: list[Any], optimizers: list[Any], schedulers: list[Any],
                               custom_objects: list[Any], scaler: Any, process_index: int, strict: bool,
                               device: Any) -> int | None:
    """Restore models, optimizers, schedulers, the scaler, registered objects and this process's RNG states from
    an Accelerate checkpoint. Returns the saved `accelerator.step` (None when the file with it is absent)."""
    if any(directory.glob("pytorch_model_fsdp_*")) or any(directory.glob("*/mp_rank_*")):
        raise CheckpointError(f"{directory}: an Accelerate FSDP or DeepSpeed checkpoint (sharded per process in "
                              "torch's or DeepSpeed's own format), which acc does not read; load its consolidated "
                              "weights instead (accelerate merge-weights, then load_checkpoint_in_model)")
    for i, model in enumerate(models):
        model.load_state_dict(_model_state(directory, i), strict=strict)
    for i, optimizer in enumerate(optimizers):
        name = "optimizer.bin" if i == 0 else f"optimizer_{i}.bin"
        optimizer.load_state_dict(load(_required(directory / name, f"optimizer #{i}"), map_location=device))
    for i, scheduler in enumerate(schedulers):
        name = "scheduler.bin" if i == 0 else f"scheduler_{i}.bin"
        scheduler.load_state_dict(load(_required(directory / name, f"scheduler #{i}")))
    if scaler is not None and (directory / "scaler.pt").exists():
        scaler.load_state_dict(load(directory / "scaler.pt"))
    for i, obj in enumerate(custom_objects):
        obj.load_state_dict(load(_required(directory / f"custom_checkpoint_{i}.pkl", f"registered object #{i}")))
    if any(directory.glob("dl_state_dict*.bin")):
        warnings.warn(f"{directory}: Accelerate's data-loader states (dl_state_dict*.bin) are not read by acc: the "
                      "data loaders start their epoch at batch 0", stacklevel=4)
    rng = directory / f"random_states_{process_index}.pkl"
    if not rng.exists():
        return None
    states = load(rng, numpy=True)
    _set_rng(states)
    return states.get("step")
