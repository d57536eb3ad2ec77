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


def save_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: Any, output_dir: str | os.PathLike,
                    model_index: int = 0, adapter_only: bool = False) -> Path:
    """Write `model`'s weights under `output_dir`; returns the file or directory written."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    full = _full(fsdp_plugin)
    _refuse_adapter_only(model, adapter_only)
    state = get_model_state_dict(model, options=_options(full))
    target = Path(output_dir) / _name("pytorch_model_fsdp", model_index, full)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    if full:
        if _is_main():
            torch.save(state, target)
    else:
        dcp.save({"model": state}, checkpoint_id=str(target))
    _barrier()
    return target


def load_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: Any, input_dir: str | os.PathLike,
                    model_index: int = 0, adapter_only: bool = False) -> None:
    """Load what `save_fsdp_model` wrote into `model` (a directory holding the file, or the sharded directory)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    full = _full(fsdp_plugin)
    _refuse_adapter_only(model, adapter_only)
    source = Path(input_dir)
    if full:
        path = source if source.is_file() else source / _name("pytorch_model_fsdp", model_index, True)
        state = torch.load(path, map_location="cpu", weights_only=True)
    else:
        path = source if (source / ".metadata").exists() else source / _name("pytorch_model_fsdp", model_index, False)
        state = {"model": get_model_state_dict(model, options=_options(False))}
        dcp.load(state, checkpoint_id=str(path))
        state = state["model"]
    set_model_state_dict(model, state, options=_options(full))


def save_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: Any,
                        output_dir: str | os.PathLike, optimizer_index: int = 0) -> Path:
    """Write `optimizer`'s state (its parameters named as in `model`) under `output_dir`."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = _full(fsdp_plugin)
    state = get_optimizer_state_dict(model, _unwrap(optimizer), options=_options(full))
    target = Path(output_dir) / _name("optimizer", optimizer_index, full)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    if full:
        if _is_main():
            torch.save(state, target)
    else:
        dcp.save({"optimizer": state}, checkpoint_id=str(target))
    _barrier()
    return target


def load_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: Any,
                        input_dir: str | os.PathLike, optimizer_index: int = 0, adapter_only: bool = False) -> None:
    """Load what `save_fsdp_optimizer` wrote into `optimizer`."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    full = _full(fsdp_plugin)
    inner = _unwrap(optimizer)
    source = Path(input_dir)
    if full:
        path = source if source.is_file() else source / _name("optimizer", optimizer_index, True)
        state = torch.load(path, map_location="cpu", weights_only=True)
    else:
        path = source if (source / ".metadata").exists() else source / _name("optimizer", optimizer_index, False)
        wrapped = {"optimizer": get_optimizer_state_dict(model, inner, options=_options(False))}
        dcp.load(wrapped, checkpoint_id=str(path))
        state = wrapped["optimizer"]
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
