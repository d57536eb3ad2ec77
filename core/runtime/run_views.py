"""The run as an `Accelerator` shows it: the settings, the process facts, the data-loading choices and the loop's
counters (Accelerate's property names), each read from the run context when asked, never copied.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

from acc.compat.plugin_objects import ProfileKwargs
from acc.contract.enums import DistributedType, FP8BackendType
from acc.contract.kwargs import AutocastKwargs, DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs

if TYPE_CHECKING:  # pragma: no cover
    import torch


def forgotten_message(state: str, name: str) -> str:
    """Accelerate's words for a state attribute read after `_reset_state()` forgot the run."""
    return (f"`{state}` object has no attribute `{name}`. This happens if `{state}._reset_state()` was called and "
            "an `Accelerator` or `PartialState` was not reinitialized.")


class RunViews:
    """Mixed into `acc.accelerator.Accelerator`, which sets `ctx` (the run context), `_runtime`, `_assembly`,
    `_dataloader_config` and `_even_batches`."""

    ctx: Any
    _runtime: Any
    _assembly: Any
    _dataloader_config: Any
    _even_batches: bool

    @property
    def dataloader_config(self) -> Any:
        """The DataLoaderConfiguration; one assigned later applies to the loaders prepared after (and to what
        load_state resumes), as in Accelerate."""
        return self._dataloader_config

    @dataloader_config.setter
    def dataloader_config(self, config: Any) -> None:
        source = "code accelerator.dataloader_config = ..."
        settings = self.ctx.settings
        for name, value in (("use_seedable_sampler", bool(config.use_seedable_sampler)),
                            ("data_seed", config.data_seed),
                            ("resume_data_position", bool(config.use_stateful_dataloader))):
            settings = settings.override(name, value, source)
        self.ctx.settings = settings
        self._dataloader_config = config
        self._even_batches = bool(config.even_batches)

    @property
    def settings(self) -> Any:
        return self.ctx.settings

    # The kwargs handlers given to Accelerator(kwargs_handlers=...), under Accelerate's attribute names (None: not
    # given). acc refuses fp8 recipe handlers when the Accelerator is built, so those read None and fp8 is off.
    ddp_handler = property(lambda self: self.ctx.handler(DistributedDataParallelKwargs))
    scaler_handler = property(lambda self: self.ctx.handler(GradScalerKwargs))
    init_handler = property(lambda self: self.ctx.handler(InitProcessGroupKwargs))
    autocast_handler = property(lambda self: self.ctx.handler(AutocastKwargs))
    profile_handler = property(lambda self: self.ctx.handler(ProfileKwargs))
    fp8_recipe_handler = ao_recipe_handler = te_recipe_handler = msamp_recipe_handler = None
    has_fp8_handler = fp8_enabled = has_lomo_optimizer = False

    @property
    def parallelism_config(self) -> Any:
        """The ParallelismConfig given to the Accelerator (checked against the run), or None."""
        return self._runtime.parallelism_config

    @property
    def torch_device_mesh(self) -> Any:
        """Its torch DeviceMesh (named dims with sizes above 1, plus the flattened `dp`, `dp_shard_cp`, `dp_cp`),
        built on the run's process group when first asked; None without a ParallelismConfig or on one process."""
        return self._runtime.device_mesh

    @contextlib.contextmanager
    def maybe_context_parallel(self, buffers: list[Any] | None = None, buffer_seq_dims: list[int] | None = None,
                               no_restore_buffers: set[Any] | None = None) -> Iterator[None]:
        """Accelerate's context-parallel block: inside it, `buffers` (inputs, labels, position ids) are sharded
        along `buffer_seq_dims` over the mesh's `cp` dim by torch's `context_parallel` (the rotation its cp_handler's
        cp_comm_strategy names), and restored after it except `no_restore_buffers`. Without cp (cp_size 1, or no
        ParallelismConfig) it does nothing, saying so once, as Accelerate does; make one per step."""
        config = self.parallelism_config
        if config is None or not config.cp_enabled:
            from acc.runtime.arguments import note_once

            note_once("maybe_context_parallel", "context parallel training is not enabled (no ParallelismConfig "
                      "with cp_size > 1): maybe_context_parallel has no effect", self.ctx.process_index == 0)
            yield
            return
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        handler = config.cp_handler
        set_rotate_method(handler.cp_comm_strategy if handler is not None else "allgather")
        with context_parallel(self.torch_device_mesh["cp"], buffers=buffers, buffer_seq_dims=buffer_seq_dims,
                              no_restore_buffers=no_restore_buffers):
            yield

    @property
    def fp8_backend(self) -> Any:
        """Accelerate's FP8BackendType of the run: NO (acc has no fp8 training)."""
        return FP8BackendType.NO

    @property
    def backend(self) -> str:
        return self.ctx.backend

    def _live(self, name: str) -> Any:
        """The run context, unless `AcceleratorState._reset_state()` forgot this Accelerator's run: then the
        AttributeError Accelerate raises there (for the run's configuration: device, num_processes,
        distributed_type; this process's indices, and so `is_main_process` and the like, stay readable, as
        Accelerate reads those from PartialState)."""
        if getattr(self._runtime, "forgotten", False):
            raise AttributeError(forgotten_message("AcceleratorState", name))
        return self.ctx

    @property
    def device(self) -> torch.device:
        return self._live("device").device

    @property
    def num_processes(self) -> int:
        return self._live("num_processes").num_processes

    @property
    def process_index(self) -> int:
        return self.ctx.process_index

    @property
    def local_process_index(self) -> int:
        return self.ctx.local_process_index

    @property
    def distributed_type(self) -> DistributedType | str:
        """Accelerate's DistributedType of this run, as the backend declares it (e.g. MULTI_CPU, FSDP)."""
        self._live("distributed_type")
        return self._runtime.distributed_type

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        return self._even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self._even_batches = bool(value)

    @property
    def use_seedable_sampler(self) -> bool:
        return self.settings["use_seedable_sampler"]

    @property
    def use_stateful_dataloader(self) -> bool:
        return self.settings["resume_data_position"]

    @property
    def non_blocking(self) -> bool:
        return self.dataloader_config.non_blocking

    @property
    def step_scheduler_with_optimizer(self) -> bool:
        return self.settings["scheduler_stepping"] != "every_call"

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.settings["gradient_accumulation_steps"]

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        value = self._assembly.registry["gradient_accumulation_steps"].convert(value)
        self.ctx.settings = self.ctx.settings.override("gradient_accumulation_steps", value,
                                                       "code accelerator.gradient_accumulation_steps = ...")

    @property
    def sync_gradients(self) -> bool:
        return self.ctx.loop.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.ctx.loop.sync_gradients = bool(value)

    @property
    def step(self) -> int:
        """Micro-steps (`accumulate` calls) since the end of the last pass over the data, as in Accelerate."""
        return self.ctx.loop.micro_step

    @step.setter
    def step(self, value: int) -> None:
        self.ctx.loop.micro_step = int(value)

    @property
    def applied_steps(self) -> int:
        """Optimizer steps applied so far (a step the fp16 scaler skipped does not count): acc's counter."""
        return self.ctx.loop.step
