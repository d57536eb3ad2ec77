"""The Accelerator's checkpoint methods (`save_state`, `load_state`, `save_model`, `save`, `get_state_dict`, the
pre-hooks, `register_for_checkpointing`, `project_configuration`), over its `Checkpointer`
(`acc.checkpointing.checkpointer`) and its registry of prepared objects (`acc.runtime.prepared`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from acc.checkpointing.files import ProjectConfiguration

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from acc.runtime.data.loader import PreparedDataLoader
    from acc.runtime.optim import AcceleratedOptimizer, AcceleratedScheduler


class CheckpointingMethods:
    """Mixed into `acc.accelerator.Accelerator`, which sets `_checkpointer` and `_prepared`."""

    _checkpointer: Any
    _prepared: Any

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        return self.project_configuration.iteration

    @property
    def run_dir(self) -> str | None:
        """The launch's run directory (its manifest.json), when started by `acc launch`."""

        return os.environ.get("ACC_RUN_DIR")

    @property
    def project_configuration(self) -> ProjectConfiguration:
        return self._checkpointer.project_configuration

    @project_configuration.setter
    def project_configuration(self, config: ProjectConfiguration) -> None:
        self._checkpointer.project_configuration = config

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects with the state (each needs state_dict and load_state_dict)."""
        self._prepared.register(*objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> Any:
        """Call `hook(models, weights, output_dir)` in `save_state` before anything is written; a hook that saves
        a model itself removes its entry from `weights`, and acc then does not write that model. Returns a handle
        whose `remove()` unregisters the hook."""
        return self._checkpointer.register_save_state_pre_hook(hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> Any:
        """Call `hook(models, input_dir)` in `load_state` before anything is read; a hook that loads a model itself
        removes it from `models`, and acc then does not load that model."""
        return self._checkpointer.register_load_state_pre_hook(hook)

    def save_state(self, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True,
                   **save_model_func_kwargs: Any) -> Path:
        """Write everything needed to resume into `output_dir` (or the next automatic name), on every process;
        the directory appears only once complete. Returns it (saving.py: what is written, and how)."""
        return self._checkpointer.save_state(output_dir, safe_serialization, **save_model_func_kwargs)

    def load_state(self, input_dir: str | os.PathLike | None = None, load_kwargs: dict | None = None,
                   strict: bool = True, **load_model_func_kwargs: Any) -> Path:
        """Restore what `save_state` wrote; with no directory, the newest complete automatic checkpoint whose
        files verify (saving.py: what is restored; data positions only with resume_data_position)."""
        return self._checkpointer.load_state(input_dir, load_kwargs, strict, **load_model_func_kwargs)

    def get_state_dict(self, model: Any, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The model's full state dict (gathered from shards where needed), complete on the main process."""
        return self._checkpointer.get_state_dict(model, unwrap)

    def save_model(self, model: Any, save_directory: str | os.PathLike, max_shard_size: int | str = "10GB",
                   safe_serialization: bool = True) -> None:
        """Write the unwrapped model's weights as safetensors (sharded with an index file when large)."""
        self._checkpointer.save_model(model, save_directory, max_shard_size, safe_serialization)

    def save(self, obj: Any, path: str | os.PathLike) -> None:
        """torch.save on the main process only (other processes return at once)."""
        self._checkpointer.save(obj, path)

    # the registry under Accelerate's private names, which some scripts read
    @property
    def _models(self) -> list[Any]:
        return self._prepared.models

    @property
    def _optimizers(self) -> list[AcceleratedOptimizer]:
        return self._prepared.optimizers

    @property
    def _schedulers(self) -> list[AcceleratedScheduler]:
        return self._prepared.schedulers

    @property
    def _dataloaders(self) -> list[PreparedDataLoader]:
        return self._prepared.dataloaders

    @property
    def _custom_objects(self) -> list[Any]:
        return self._prepared.custom_objects
