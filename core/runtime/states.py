"""Accelerate's state objects: `PartialState`, `AcceleratorState`, `GradientState` (public path `acc.state`).

They are views of the current run (acc.runtime.worker): creating one reads the process's facts, never copies them.
`PartialState()` in a script without an `Accelerator` (an inference script started by `acc launch` or
torchrun) sets the backend up as `Accelerator()` would, so `split_between_processes`, `wait_for_everyone`
and the free collectives of `acc.utils` work there.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from acc.contract.enums import DistributedType
from acc.runtime import worker as _runtime
from acc.runtime.process_views import ProcessViews
from acc.runtime.run_views import forgotten_message


def is_initialized() -> bool:
    """Whether a run (an Accelerator or a PartialState) is set up in this process."""
    return _runtime.current() is not None


class PartialState(ProcessViews):
    """The process's place in the run: device, indices, the process group. Every instance sees the same run."""

    def __init__(self, cpu: bool = False, **kwargs: Any):
        _runtime.current_or_start(cpu=cpu, **kwargs)

    @property
    def _run(self) -> Any:
        run = _runtime.current()
        if run is None:  # `_reset_state()` forgot the run and none was set up since: __getattr__ says so
            raise AttributeError("_run")
        return run

    _user_attributes: dict[str, Any] = {}  # what scripts set on a state: shared by every instance of the class

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._user_attributes = {}

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)  # a property's own setter (or its AttributeError)
        else:
            type(self)._user_attributes[name] = value  # every instance sees it, as Accelerate's shared state

    def __getattr__(self, name: str) -> Any:
        # reached for a name the class does not define, or when a property found no run
        if name in type(self)._user_attributes:
            return type(self)._user_attributes[name]
        if not name.startswith("__") and _runtime.current() is None and \
                isinstance(getattr(type(self), name, None), property):
            raise AttributeError(forgotten_message(type(self).__name__, name))
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    @staticmethod
    def _reset_state() -> None:
        """Forget this process's run, so the next PartialState or Accelerator sets one up anew (Accelerate's test
        helper). The process group stays; nothing of the forgotten run is torn down before exit."""
        _runtime.forget()
        PartialState._user_attributes.clear()

    @property
    def initialized(self) -> bool:
        return is_initialized()

    @property
    def distributed_type(self) -> DistributedType | str:
        return self._run.distributed_type

    @property
    def num_processes(self) -> int:
        return self._run.num_processes

    @property
    def process_index(self) -> int:
        return self._run.process_index

    @property
    def local_process_index(self) -> int:
        return self._run.local_process_index

    @property
    def device(self) -> Any:
        return self._run.device

    @property
    def backend(self) -> str | None:
        """The torch.distributed backend ("gloo", "nccl", ...), or None on one process."""
        if self.num_processes == 1:
            return None
        return self._run.ctx.process.process_group_backend

    @property
    def debug(self) -> bool:
        """Accelerate's debug mode: reduce, broadcast and pad_across_processes check the processes' shapes first
        (DistributedOperationException on a mismatch). From ACCELERATE_DEBUG_MODE, or set it here."""
        from acc.runtime.collectives import debug_checks

        return debug_checks(self._run.ctx)

    @debug.setter
    def debug(self, value: bool) -> None:
        self._run.ctx.debug_operations = bool(value)

    def wait_for_everyone(self) -> None:
        self._run.wait_for_everyone()

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's contiguous share of a list, tuple, tensor, `datasets.Dataset` or dict of them."""
        with self._run.split_between_processes(inputs, apply_padding=apply_padding) as part:
            yield part

    @property
    def default_device(self) -> Any:
        return self.device

    def set_device(self) -> None:
        """The device is set when the run is set up (acc_setup); nothing to do."""

    def destroy_process_group(self, group: Any = None) -> None:
        """End the run's process group (what Accelerator.end_training does)."""
        run = _runtime.current()
        if run is not None:
            run.teardown()

    def _header(self) -> str:
        backend = self.backend
        return (f"Distributed environment: {self.distributed_type}{f'  Backend: {backend}' if backend else ''}\n"
                f"Num processes: {self.num_processes}\nProcess index: {self.process_index}\n"
                f"Local process index: {self.local_process_index}\nDevice: {self.device}\n")

    def __repr__(self) -> str:
        return self._header()


class AcceleratorState(PartialState):
    """PartialState plus the run's training configuration (mixed precision, the sharding backend's plugin)."""

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:  # type: ignore[override]
        """Forget the run's training configuration, so the next Accelerator sets it up anew. acc keeps no training
        configuration apart from the run, so the run itself is forgotten either way (`reset_partial_state` is
        accepted as Accelerate takes it)."""
        _runtime.forget()
        AcceleratorState._user_attributes.clear()
        if reset_partial_state:
            PartialState._user_attributes.clear()

    @property
    def mixed_precision(self) -> str:
        return self._run.settings["mixed_precision"]

    @property
    def deepspeed_plugin(self) -> Any:
        """A view of the DeepSpeed configuration when the run uses the deepspeed backend, else None."""
        run = self._run
        if run.distributed_type != DistributedType.DEEPSPEED:
            return None
        return _DeepSpeedView(run)

    @property
    def fsdp_plugin(self) -> Any:
        """The FullyShardedDataParallelPlugin when the run uses the fsdp backend (the one given to the Accelerator,
        or one with Accelerate's FSDP2 defaults), else None, as in Accelerate."""
        run = self._run
        return run.fsdp_plugin if run.distributed_type == DistributedType.FSDP else None

    @property
    def dynamo_plugin(self) -> Any:
        return None

    @property
    def parallelism_config(self) -> Any:
        """The run's ParallelismConfig (given to the Accelerator), or None."""
        return getattr(self._run, "parallelism_config", None)

    @property
    def device_mesh(self) -> Any:
        """The ParallelismConfig's DeviceMesh (what `accelerator.torch_device_mesh` returns), or None."""
        return self._run.device_mesh if getattr(self._run, "parallelism_config", None) is not None else None

    @property
    def use_ipex(self) -> bool:
        return False

    def __repr__(self) -> str:
        return self._header() + f"\nMixed precision type: {self.mixed_precision}\n"


class _DeepSpeedView:
    """What scripts read of `AcceleratorState().deepspeed_plugin`: the engine's config and the ZeRO stage."""

    def __init__(self, run: Any):
        self._run = run

    @property
    def deepspeed_config(self) -> dict:
        return self._run.ctx.backend_config  # the user's config until prepare, the engine's after

    @property
    def zero_stage(self) -> int:
        stage = self.deepspeed_config.get("zero_optimization", {}).get("stage")  # the config's, else the setting
        return int(stage if stage is not None else (self._run.settings.get("zero_stage", 0) or 0))

    @property
    def hf_ds_config(self) -> Any:
        return self._run.hf_ds_config


class GradientState:
    """The run's gradient-accumulation facts: whether this micro-step syncs, the active data loader's end."""

    def __init__(self, gradient_accumulation_plugin: Any = None):
        self._plugin = gradient_accumulation_plugin

    @property
    def _accelerator(self) -> Any:
        run = _runtime.current()
        ref = run.accelerator if run is not None else None
        return ref() if ref is not None else None

    @property
    def _loop(self) -> Any:
        run = _runtime.current()
        if run is None:
            from acc.contract.context import LoopState

            return LoopState()
        return run.ctx.loop

    @property
    def initialized(self) -> bool:
        return is_initialized()

    @staticmethod
    def _reset_state() -> None:
        """Back to a fresh loop: gradients sync, no step taken, no active data loader (Accelerate's test helper)."""
        run = _runtime.current()
        if run is not None:  # in place: the prepared optimizers and loaders hold this loop state
            loop = run.ctx.loop
            loop.sync_gradients, loop.step, loop.micro_step = True, 0, 0
            loop.active_loaders.clear()

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        from dataclasses import asdict

        plugin = self._plugin or getattr(self._accelerator, "gradient_accumulation_plugin", None)
        kwargs = asdict(plugin) if plugin is not None else {}
        kwargs["num_steps"] = self.num_steps
        return kwargs

    @property
    def num_steps(self) -> int:
        accelerator = self._accelerator
        return accelerator.gradient_accumulation_steps if accelerator is not None else 1

    @property
    def adjust_scheduler(self) -> bool:
        return self.plugin_kwargs.get("adjust_scheduler", True)

    @property
    def sync_with_dataloader(self) -> bool:
        return self.plugin_kwargs.get("sync_with_dataloader", True)

    @property
    def sync_gradients(self) -> bool:
        return self._loop.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self._loop.sync_gradients = bool(value)

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        """Accelerate's setter that loops of their own call (transformers' Trainer, before each micro-step)."""
        self.sync_gradients = sync_gradients

    @property
    def end_of_dataloader(self) -> bool:
        return self._loop.end_of_dataloader

    @property
    def remainder(self) -> int:
        return self._loop.remainder

    @property
    def active_dataloader(self) -> Any:
        return self._loop.active_loader

    @property
    def dataloader_references(self) -> list:
        return list(self._loop.active_loaders) or [None]

    @property
    def in_dataloader(self) -> bool:
        return self._loop.active_loader is not None

    def __repr__(self) -> str:
        return (f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
                f"Extra samples added: {self.remainder}\nGradient accumulation plugin: {self.plugin_kwargs}\n")


__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "is_initialized"]
