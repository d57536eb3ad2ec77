"""Accelerate's `accelerate.utils.fsdp_utils`: `merge_fsdp_weights`, one weights file from a sharded checkpoint,
through the same code as `acc merge-weights` (`acc.checkpointing.merge`); `save_fsdp_model`, `load_fsdp_model`,
`save_fsdp_optimizer`, `load_fsdp_optimizer` on torch.distributed.checkpoint (`acc.checkpointing.fsdp_files`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from acc.checkpointing.fsdp_files import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer
from acc.logging import get_logger
from acc.utils.constants import SAFE_WEIGHTS_NAME, WEIGHTS_NAME  # noqa: F401  (Accelerate names them here too)

logger = get_logger(__name__)



def merge_fsdp_weights(checkpoint_dir: str | os.PathLike, output_path: str | os.PathLike,
                       safe_serialization: bool = True, remove_checkpoint_dir: bool = False) -> Path:
    """Merge the model weights of an acc checkpoint saved on a sharding backend (fsdp, any number of processes)
    into `{output_path}/model.safetensors`, or with `safe_serialization=False` `{output_path}/pytorch_model.bin`
    (a torch file). `remove_checkpoint_dir` deletes the checkpoint afterwards. The main process writes; in
    a process group every process waits for it. Returns the file's path.

    The checkpoint is acc's (a `save_state` directory with its manifest; the first prepared model), not
    torch.distributed.checkpoint's: CheckpointError names what is wrong with another directory.
    """
    from acc.checkpointing.merge import merge_weights

    checkpoint = Path(checkpoint_dir)
    output = Path(output_path)
    target = output / (SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME)
    if int(os.environ.get("RANK", "0")) == 0:
        logger.info(f"Merging FSDP weights from {checkpoint}")
        output.mkdir(parents=True, exist_ok=True)
        if safe_serialization:
            merge_weights(checkpoint, target, 0)
        else:
            import torch
            from safetensors.torch import load_file

            with tempfile.TemporaryDirectory(dir=output) as tmp:
                merged = Path(tmp) / SAFE_WEIGHTS_NAME
                merge_weights(checkpoint, merged, 0)
                torch.save(load_file(str(merged)), target)
        logger.info(f"Successfully merged FSDP weights and saved to {target}")
        if remove_checkpoint_dir:
            logger.info(f"Removing old checkpoint directory {checkpoint}")
            shutil.rmtree(checkpoint)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return target


__all__ = ["load_fsdp_model", "load_fsdp_optimizer", "merge_fsdp_weights", "save_fsdp_model", "save_fsdp_optimizer"]
