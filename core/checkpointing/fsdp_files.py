"""Accelerate's `save_fsdp_model` / `load_fsdp_model` / `save_fsdp_optimizer` / `load_fsdp_optimizer` (what
transformers' Trainer calls to checkpoint a sharded model), on `torch.distributed.checkpoint`: with the plugin's
`state_dict_type` FULL_STATE_DICT one file written by the main process (`pytorch_model_fsdp[_N].bin`,
`optimizer[_N].bin`), otherwise a sharded directory (`pytorch_model_fsdp_N/`, `optimizer_N/`) every process writes
its part of. They take any prepared model (FSDP2, DDP or plain) on any backend; files load weights-only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _full(fsdp_plugin: Any) -> bool:
    kind = getattr(fsdp_plugin, "state_dict_type", None)
    return "FULL" in str(getattr(kind, "name", kind) or "").upper()


def _is_main() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _options(full: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, cpu_offload=full)


def _name(stem: str, index: int, full: bool, suffix: str = ".bin") -> str:
    return (f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}") if full else f"{stem}_{index}"


def _write(state: dict, output_dir: str | os.PathLike, stem: str, index: int, full: bool, key: str) -> Path:
    """One full file written by the main process, or a torch.distributed.checkpoint directory every process writes
    its part of (the state under `key`); every process returns when it is complete."""
    import torch
    import torch.distributed.checkpoint as dcp

    target = Path(output_dir) / _name(stem, index, full)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    if full:
        if _is_main():
            torch.save(state, target)
    else:
        dcp.save({key: state}, checkpoint_id=str(target))
    _barrier()
    return target


def _read(input_dir: str | os.PathLike, stem: str, index: int, full: bool, key: str, like: dict) -> dict:
    """What `_write` wrote (`input_dir` may also be the file or directory itself); a sharded one is read into the
    shape of `like`, the current state."""
    import torch
    import torch.distributed.checkpoint as dcp

    source = Path(input_dir)
    if full:
        path = source if source.is_file() else source / _name(stem, index, True)
        return torch.load(path, map_location="cpu", weights_only=True)
    path = source if (source / ".metadata").exists() else source / _name(stem, index, False)
    wrapped = {key: like}
    dcp.load(wrapped, checkpoint_id=str(path))
    return wrapped[key]


def save_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: Any, output_dir: str | os.PathLike,
                    model_index: int = 0, adapter_only: bool = False) -> Path:
    """Write `model`'s weights under `output_dir`; returns the file or directory written."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    full = _full(fsdp_plugin)
    _refuse_adapter_only(model, adapter_only)
    state = get_model_state_dict(model, options=_options(full))
    return _write(state, output_dir, "pytorch_model_fsdp", model_index, full, "model")


def load_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: Any, input_dir: str | os.PathLike,
                    model_index: int = 0, adapter_only: bool = False) -> None:
    """Load what `save_fsdp_model` wrote into `model` (a directory holding the file, or the sharded directory)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    full = _full(fsdp_plugin)
    _refuse_adapter_only(model, adapter_only)
    like = {} if full else get_model_state_dict(model, options=_options(False))
    state = _read(input_dir, "pytorch_model_fsdp", model_index, full, "model", like)
    set_model_state_dict(model, state, options=_options(full))


def save_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: Any,
                        output_dir: str | os.PathLike, optimizer_index: int = 0) -> Path:
    """Write `optimizer`'s state (its parameters named as in `model`) under `output_dir`."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = _full(fsdp_plugin)
    state = get_optimizer_state_dict(model, _unwrap(optimizer), options=_options(full))
    return _write(state, output_dir, "optimizer", optimizer_index, full, "optimizer")


def load_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: Any,
                        input_dir: str | os.PathLike, optimizer_index: int = 0, adapter_only: bool = False) -> None:
    """Load what `save_fsdp_optimizer` wrote into `optimizer`."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    full = _full(fsdp_plugin)
    inner = _unwrap(optimizer)
    like = {} if full else get_optimizer_state_dict(model, inner, options=_options(False))
    state = _read(input_dir, "optimizer", optimizer_index, full, "optimizer", like)
    set_optimizer_state_dict(model, inner, state, options=_options(full))


def _refuse_adapter_only(model: Any, adapter_only: bool) -> None:
    """`adapter_only` (transformers' Trainer always passes it) means something only for a peft model: its adapter
    weights alone. acc does not write those yet; for any other model the whole state is written, as in Accelerate."""
    inner = getattr(model, "module", model)
    if adapter_only and any(type(m).__name__.startswith("Peft") for m in (model, inner)):
        from acc.errors import AccError

        raise AccError("save_fsdp_model/load_fsdp_model(adapter_only=True) of a peft model: acc does not write "
                       "adapter-only FSDP checkpoints yet; save the adapter with model.save_pretrained(...)")


def _unwrap(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # acc's AcceleratedOptimizer holds the torch optimizer


__all__ = ["load_fsdp_model", "load_fsdp_optimizer", "save_fsdp_model", "save_fsdp_optimizer"]
