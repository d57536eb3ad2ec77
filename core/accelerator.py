"""The facade users call. Names, signatures and results follow Hugging Face Accelerate 1.15, so a script
written for Accelerate trains identically with only its imports changed; acc's own semantics are settings
(`semantics = "acc"`, see settings.loop_semantics_settings).

This is the only worker-side caller of `pm.hook.*`: every collective, wrap, backward and step goes
through a hook, so a backend changes behaviour without the facade knowing which backend runs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
import weakref
from typing import Any, Callable, Iterator

import pluggy
import torch

from acc.assembly.choose import Assembly
from acc.checkpointing.checkpointer import Checkpointer
from acc.checkpointing.facade import CheckpointingMethods
from acc.checkpointing.files import ProjectConfiguration
from acc.contract.kwargs import AutocastKwargs, DataLoaderConfiguration, GradientAccumulationPlugin, GradScalerKwargs
from acc.errors import AccError
from acc.runtime.arguments import note_once, read_arguments
from acc.runtime.collectives import CollectivesMixin
from acc.runtime.containers import compiled_around, is_compiled_module, strip_containers
from acc.runtime.data.loader import DataSettings, PreparedDataLoader
from acc.runtime.data.loader import skip_first_batches as _skip_first_batches
from acc.runtime.init_module import check_empty_init, check_meta_models, check_quantized_placement, has_meta
from acc.runtime.optim import AcceleratedOptimizer, AcceleratedScheduler, move_optimizer_state
from acc.runtime.parallelism import data_parallel_position
from acc.runtime.placeholders import DummyOptim, DummyScheduler, check_prepare
from acc.runtime.precision import BackendStepper, Precision, check_supported
from acc.runtime.prepared import PreparedObjects
from acc.runtime.probes import is_bitsandbytes_multi_backend_available, is_xpu_available  # noqa: F401 (patched here)
from acc.runtime.process_views import ProcessViews
from acc.runtime.run_views import RunViews
from acc.runtime.worker import Runtime
from acc.tracking.facade import TrackingMethods

_SCHEDULER_TYPES: tuple[type, ...] = (torch.optim.lr_scheduler.LRScheduler,)
if hasattr(torch.optim.lr_scheduler, "ReduceLROnPlateau"):
    _SCHEDULER_TYPES += (torch.optim.lr_scheduler.ReduceLROnPlateau,)

_UNSET: Any = type("_Unset", (), {"__repr__": lambda self: "<not given>", "__bool__": lambda self: False})()


class Accelerator(CollectivesMixin, ProcessViews, RunViews, CheckpointingMethods, TrackingMethods):
    """Runs one training loop on whichever backend the launch (or `ACC_BACKEND`, or a config file) chose.

    Arguments given here override the launch settings (a warning says so when they contradict a value
    that was set explicitly). acc's own keyword arguments: `even_batches` (also in `dataloader_config`),
    `semantics` ("accelerate" or "acc": see docs/guides/migrating-from-accelerate.md), and `plugin_manager`
    (tests and embedding: a ready pluggy manager).
    """

    # Accelerate's arguments acc takes only as None today (an error names them otherwise)
    _unsupported_arguments = ("torch_tp_plugin", "megatron_lm_plugin")

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = _UNSET,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool | None = None,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool | None = None,
        kwargs_handlers: list | None = None,
        dynamo_backend: Any = None,
        dynamo_plugin: Any = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        *,
        even_batches: bool | None = None,
        semantics: str | None = None,
        plugin_manager: pluggy.PluginManager | None = None,
    ):
        if split_batches is not _UNSET:
            warnings.warn(f"Accelerator(split_batches={split_batches!r}) is ignored, as Accelerate 1.15 ignores it; "
                          "to split batches pass dataloader_config=DataLoaderConfiguration(split_batches=True)",
                          stacklevel=2)
        args = read_arguments(
            mixed_precision=mixed_precision, gradient_accumulation_steps=gradient_accumulation_steps, cpu=cpu,
            dataloader_config=dataloader_config, deepspeed_plugin=deepspeed_plugin, fsdp_plugin=fsdp_plugin,
            torch_tp_plugin=torch_tp_plugin, megatron_lm_plugin=megatron_lm_plugin,
            gradient_accumulation_plugin=gradient_accumulation_plugin,
            step_scheduler_with_optimizer=step_scheduler_with_optimizer, kwargs_handlers=kwargs_handlers,
            dynamo_backend=dynamo_backend, dynamo_plugin=dynamo_plugin, deepspeed_plugins=deepspeed_plugins,
            parallelism_config=parallelism_config, semantics=semantics)
        self.dynamo_plugin = dynamo_plugin
        self.gradient_accumulation_plugin = args.gradient_accumulation_plugin
        self._dataloader_config = args.dataloader_config
        code, handlers, backend_plugins = args.code, args.handlers, args.backend_plugins
        self._runtime = Runtime(code, handlers, plugin_manager, backend_plugins=backend_plugins,
                                parallelism_config=args.parallelism_config)
        self._runtime.accelerator = weakref.ref(self)
        self._assembly: Assembly = self._runtime.assembly
        self._pm = self._runtime._pm
        self._hooks = self._runtime.hooks
        self.ctx = self._runtime.ctx
        self.device_placement = device_placement
        self._even_batches = self.dataloader_config.even_batches if even_batches is None else even_batches
        self.rng_types = list(rng_types) if rng_types is not None else ["generator"]
        self._precision = self._make_precision()
        self._backward_hook = self._hooks.acc_backward
        self._prepared = PreparedObjects()  # what prepare returned and register_for_checkpointing added
        self._steppers: list[BackendStepper] = []
        self._prepared_for: dict[int, AcceleratedOptimizer] = {}
        config = project_config or ProjectConfiguration(project_dir=project_dir)
        if project_dir is not None and config.project_dir is None:
            config.set_directories(project_dir)
        me = weakref.ref(self)  # the checkpointer and the loaders reach back weakly: no cycle keeps this alive
        self._checkpointer = Checkpointer(
            self.ctx, self._hooks, self._prepared, unwrap=lambda *a, **k: me().unwrap_model(*a, **k),  # type: ignore[union-attr]
            scaler=lambda: me().scaler,  # type: ignore[union-attr]
            project_configuration=config,
            plugins=self._assembly.plugin_versions(),
            distributed_type=lambda: me().distributed_type)  # type: ignore[union-attr]
        self.flag_tensor: torch.Tensor | None = None
        self._log_with = log_with
        self._tracking: Any = None
        if log_with is not None or self.settings.get("log_with"):
            self._trackers()  # an unknown or missing tracker is an error here, not at the first log
        _LIVE[self._token] = self

    def _make_precision(self) -> Precision:
        mode, info = self.mixed_precision, self.ctx.process
        if info.native_precision:
            return Precision(mode, info.device, native=True)
        if mode == "fp16" and info.device.type == "cpu" and not self.settings["fp16_on_cpu"]:
            note_once("fp16-cpu", "mixed_precision='fp16' on the CPU trains in float32 here, as Accelerate does (no "
                       "autocast, no gradient scaler); use 'bf16', or set fp16_on_cpu = true (--fp16-on-cpu) for "
                       "float16 autocast with a gradient scaler on the CPU", self.is_local_main_process)
            return Precision("no", info.device)
        check_supported(mode, info.device)
        scaler = None
        if mode == "fp16":
            handler = self.ctx.handler(GradScalerKwargs)
            scaler = self._hooks.acc_grad_scaler(ctx=self.ctx, kwargs=handler.to_kwargs() if handler else {})
        return Precision(mode, info.device, scaler=scaler, autocast_kwargs=self.ctx.handler(AutocastKwargs))

    def _data_settings(self) -> DataSettings:
        s, cfg = self.settings, self.dataloader_config
        return DataSettings(split_batches=cfg.split_batches, even_batches=self._even_batches,
                            last_batch=s["last_batch"], dispatch_batches=cfg.dispatch_batches,
                            use_seedable_sampler=s["use_seedable_sampler"], data_seed=s["data_seed"],
                            non_blocking=cfg.non_blocking, resume_data_position=s["resume_data_position"])

    # ------------------------------------------------------------------ facts
    @property
    def state(self) -> Any:
        """`AcceleratorState`: a view of this run (`logger.info(accelerator.state)` prints it)."""
        from acc.state import AcceleratorState

        # a view of the current run: made without setting a run up (after `_reset_state()` it says so when read)
        return AcceleratorState.__new__(AcceleratorState)

    @property
    def gradient_state(self) -> Any:
        """`GradientState`: a view of this run's accumulation and data-loader facts."""
        from acc.state import GradientState

        return GradientState()

    @property
    def mixed_precision(self) -> str:
        return self.settings["mixed_precision"]

    @property
    def native_amp(self) -> bool:
        """True when the kernel runs prepared models under autocast (Accelerate's name); assign False to turn
        autocast off (e.g. on a device where it is slow)."""
        return self._precision.active and self._precision.enabled

    @native_amp.setter
    def native_amp(self, value: bool) -> None:
        self._precision.enabled = bool(value)


    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when the last optimizer step was skipped (fp16 gradients overflowed)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    @property
    def scaler(self) -> Any:
        """The fp16 gradient scaler, or None."""
        return self._precision.scaler

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager:
        """This run's autocast context, for code outside the prepared models' forward (e.g. a loss)."""
        return self._precision.autocast(autocast_handler)

    # ------------------------------------------------------------------ building models
    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Build models for this backend (Lightning Fabric's `init_module`): under fsdp the parameters start on the
        meta device and each process keeps only its part of their initial values (each module's reset_parameters()
        replayed, so the weights equal a normal build's with the same seed); under deepspeed ZeRO-3 inside
        `deepspeed.zero.Init`; elsewhere (cpu, ddp) a normal build. `empty_init=True`: the weights will be loaded
        (acc.load_checkpoint_in_model reads each process's part), so their initialisation may be skipped;
        `empty_init=False`: a normal build on every backend."""
        check_empty_init(empty_init)
        build = None if empty_init is False else self._hooks.acc_init_module(ctx=self.ctx, empty_init=empty_init)
        if build is None:
            yield
            return
        with build.context():
            yield
        self._runtime.builds.append(build)

    # ------------------------------------------------------------------ prepare
    def prepare(self, *objects: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and LR schedulers for this backend; returned in order.

        Anything else, and anything already prepared, is returned unchanged. Data loaders come first (a backend
        may need their batch size), then models and optimizers of the call together (a sharding backend rebinds
        optimizers to sharded parameters), then schedulers.
        """
        if device_placement is not None and len(device_placement) != len(objects):
            raise ValueError(f"device_placement has {len(device_placement)} entries for {len(objects)} objects")
        placement = device_placement or [self.device_placement] * len(objects)
        check_prepare(objects, self.backend, self.distributed_type)  # DummyOptim/DummyScheduler need deepspeed
        result: list[Any] = list(objects)
        fresh = [not getattr(o, "_is_accelerate_prepared", False) for o in objects]
        model_idx = [i for i, o in enumerate(objects) if isinstance(o, torch.nn.Module) and fresh[i]]
        opt_idx = [i for i, o in enumerate(objects) if isinstance(o, (torch.optim.Optimizer, DummyOptim)) and fresh[i]]
        for i, obj in enumerate(objects):
            if isinstance(obj, torch.utils.data.DataLoader) and fresh[i]:
                result[i] = self.prepare_data_loader(obj, device_placement=placement[i])
        if model_idx or opt_idx:
            models = []
            for i in model_idx:
                model = objects[i]
                check_quantized_placement(model, self.num_processes > 1, is_bitsandbytes_multi_backend_available())
                if placement[i] and self.device is not None and not has_meta(model):  # a meta model: the backend's
                    model = model.to(self.device)
                self._precision.patch_forward(model)
                models.append(model)
            if any(has_meta(m) for m in models):
                check_meta_models(models, self.backend, self._hooks.acc_init_module(ctx=self.ctx, empty_init=None))
            raw_opts = [objects[i] for i in opt_idx]
            self._runtime.reread_backend_plugins()
            wrapped_models, wrapped_opts = self._hooks.acc_wrap(ctx=self.ctx, models=models, optimizers=raw_opts)
            if len(wrapped_models) != len(models) or len(wrapped_opts) != len(raw_opts):
                raise AccError(f"backend '{self.backend}' answered acc_wrap with the wrong number of objects")
            for i, m in zip(model_idx, wrapped_models):
                m = self._compiled(m)
                result[i] = m
                self._models.append(m)
            for i, old, new in zip(opt_idx, raw_opts, wrapped_opts):
                if placement[i]:
                    move_optimizer_state(new, self.device)
                result[i] = AcceleratedOptimizer(new, self._step_function(new), self.ctx.loop)
                self._optimizers.append(result[i])
                self._prepared_for[id(old)] = result[i]  # a scheduler built on the user's optimizer finds it
        for i, obj in enumerate(objects):
            if isinstance(obj, (*_SCHEDULER_TYPES, DummyScheduler)) and fresh[i]:
                result[i] = self.prepare_scheduler(obj)
        for i in model_idx + opt_idx:
            _mark_prepared(result[i])
        return result[0] if len(result) == 1 else tuple(result)

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> torch.nn.Module:
        """Prepare one model (`evaluation_mode`: for inference only, so nothing synchronises its gradients)."""
        if evaluation_mode:
            if device_placement is not False and self.device is not None:
                model = model.to(self.device)
            self._precision.patch_forward(model)
            return model
        return self.prepare(model, device_placement=None if device_placement is None else [device_placement])

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer,
                          device_placement: bool | None = None) -> AcceleratedOptimizer:
        return self.prepare(optimizer, device_placement=None if device_placement is None else [device_placement])

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        if getattr(scheduler, "_is_accelerate_prepared", False):
            return scheduler
        owners = [o for o in self._optimizers if scheduler.optimizer in (o, o.optimizer)]
        if not owners and id(scheduler.optimizer) in self._prepared_for:
            owners = [self._prepared_for[id(scheduler.optimizer)]]
        if not owners:
            raise ValueError("prepare the scheduler's optimizer first (or in the same prepare call)")
        prepared = AcceleratedScheduler(
            scheduler, owners, self.ctx.loop, stepping=self.settings["scheduler_stepping"],
            num_processes=self.num_processes, split_batches=self.split_batches,
            adjust_scheduler=self.gradient_accumulation_plugin.adjust_scheduler)
        self._schedulers.append(prepared)
        _mark_prepared(prepared)
        return prepared

    def prepare_data_loader(self, data_loader: torch.utils.data.DataLoader, device_placement: bool | None = None,
                            slice_fn_for_dispatch: Callable | None = None) -> Any:
        if getattr(data_loader, "_is_accelerate_prepared", False):
            return data_loader
        if slice_fn_for_dispatch is not None:
            raise AccError("prepare_data_loader(slice_fn_for_dispatch=...) is not supported by acc: dispatched "
                           "batches are sliced along dim 0; slice in the collate_fn instead")
        place = self.device_placement if device_placement is None else device_placement
        # sharded over the data-parallel processes: the ranks of one tp group see the same batches
        shards, shard = data_parallel_position(self._runtime.parallelism_config, self.process_index, self.num_processes)
        prepared = PreparedDataLoader(
            data_loader, num_processes=shards, process_index=shard,
            device=self.device if place else None,
            settings=self._data_settings(),
            broadcast_object=self._runtime._broadcast_object,  # the run's: the loader holds no Accelerator
            broadcast_state=self._runtime._broadcast_state,
            rng_types=self.rng_types,
            on_start=self.ctx.loop.active_loaders.append,
            on_end=functools.partial(_discard, self.ctx.loop.active_loaders),  # holds the list, not the Accelerator
        )
        self._dataloaders.append(prepared)
        self.ctx.dataloaders.append(prepared)
        wrapped = self._hooks.acc_wrap_dataloader(ctx=self.ctx, loader=prepared)
        _mark_prepared(wrapped)
        return wrapped

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that skips the first `num_batches` batches (for the epoch being resumed), as Accelerate's."""
        inner = getattr(dataloader, "_prepared", dataloader)
        if self.settings["resume_data_position"] and getattr(inner, "_resume", None) is not None and num_batches:
            note_once("double-skip", f"load_state already continues this loader after batch {inner._resume[0]} "
                       f"(resume_data_position = true); skip_first_batches({num_batches}) skips {num_batches} "
                       "more. Drop one of the two.", self.is_main_process)
        return _skip_first_batches(dataloader, num_batches)

    # ------------------------------------------------------------------ training step
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backpropagate `loss`, divided by the accumulation steps (not with DeepSpeed's `scale_wrt_gas=False`: the
        caller divided it, as transformers' Trainer does), scaled for fp16."""
        if kwargs.pop("scale_wrt_gas", True) and self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        loss = self._precision.scale_loss(loss)
        self._backward_hook(ctx=self.ctx, loss=loss, kwargs=kwargs)

    def _step_function(self, optimizer: Any) -> Callable[[Any], bool]:
        """The prepared optimizer's step: through the scaler (fp16) to the backend's step hook."""
        step_hook = self._hooks.acc_optimizer_step
        self._steppers.append(BackendStepper(optimizer, lambda opt: step_hook(ctx=self.ctx, optimizer=opt)))
        return _OptimizerStep(self, len(self._steppers) - 1)

    def _do_sync(self) -> None:
        """Count one micro-step: gradients sync every k-th one and at the end of the data (Accelerate's rule)."""
        loop = self.ctx.loop
        if self.gradient_accumulation_plugin.sync_with_dataloader and loop.end_of_dataloader:
            loop.micro_step, loop.sync_gradients = 0, True
        else:
            loop.micro_step += 1
            loop.sync_gradients = loop.micro_step % self.gradient_accumulation_steps == 0

    @contextlib.contextmanager
    def accumulate(self, *models: Any) -> Iterator[None]:
        """One micro-step: gradients sync (and the optimizer steps) every k-th call and at the end of data."""
        self._do_sync()
        loop = self.ctx.loop
        sync_anyway = self.use_distributed and self.gradient_accumulation_plugin.sync_each_batch
        with contextlib.ExitStack() as stack:
            if not (loop.sync_gradients or sync_anyway):
                for model in models:
                    stack.enter_context(self._hooks.acc_no_sync(ctx=self.ctx, model=model))
            yield

    @contextlib.contextmanager
    def no_sync(self, model: Any) -> Iterator[None]:
        """Backward inside this context does not synchronise gradients across processes."""
        with self._hooks.acc_no_sync(ctx=self.ctx, model=model):
            yield

    def _unscale_all(self) -> None:
        for stepper in self._steppers:
            self._precision.unscale(stepper)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Unscale fp16 gradients now (clip_grad_norm_ and the optimizer step do it themselves); no-op otherwise."""
        wanted = None if optimizer is None else {id(getattr(o, "optimizer", o)) for o in
                                                 (optimizer if isinstance(optimizer, (list, tuple)) else [optimizer])}
        for stepper in self._steppers:
            if wanted is None or id(stepper.optimizer) in wanted:
                self._precision.unscale(stepper)

    def _clips_now(self) -> bool:
        return self.sync_gradients or self.settings["clip_on_micro_steps"]

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """Clip the total gradient norm across all processes (fp16 gradients unscaled first); returns it.

        On accumulation micro-steps it clips the partial gradients, as Accelerate does; with
        `clip_on_micro_steps = false` (acc's semantics) it does nothing there and returns None.
        """
        if not self._clips_now():
            return None
        self._unscale_all()
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        return self._hooks.acc_clip_grad_norm(ctx=self.ctx, parameters=params, max_norm=max_norm,
                                               norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clamp every gradient to [-clip_value, clip_value] (fp16 gradients unscaled first)."""
        if not self._clips_now():
            return
        self._unscale_all()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def _compiled(self, model: Any) -> Any:
        """`model` compiled when the run asks for it (dynamo_backend), after the backend wrapped it, in the way
        the backend declares (acc.runtime.compiling: regional, per unit by the backend, or the wrapped model whole)."""
        from acc.runtime.compiling import compile_prepared

        return compile_prepared(self.ctx, model, self._runtime.capabilities)

    def unwrap_model(self, model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> Any:
        """The user's module without the backend's wrapper or other containers (DDP, DataParallel, ...), and
        without the autocast forward if asked. A compiled model comes back compiled (`keep_torch_compile`): the
        same object when it wraps the module itself, else a compiled wrapper of the module with its settings
        (the prepared model is not changed, so it keeps synchronising)."""
        compiled = model if is_compiled_module(model) else None
        inner = self._hooks.acc_unwrap_model(ctx=self.ctx, model=model if compiled is None else compiled._orig_mod)
        inner = strip_containers(inner)
        if not keep_fp32_wrapper:
            Precision.unpatch(inner)
        return compiled_around(compiled, inner) if compiled is not None and keep_torch_compile else inner

    def set_trigger(self) -> None:
        """Raise this process's flag; `check_trigger` on every process then returns True (e.g. early stopping)."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """True on every process when any process called `set_trigger` since the last check (which resets it)."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        raised = self.reduce(self.flag_tensor)
        if raised.item() >= 1:
            self.flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False

    # ------------------------------------------------------------------ memory, profiling, uneven inputs
    def free_memory(self, *objects: Any) -> list:
        """Drop the references this Accelerator holds (models, optimizers, schedulers, loaders), reset `step`,
        collect garbage and empty the device cache; returns `objects` released (a list of None)."""
        from acc.utils.memory import release_memory

        for model in self._models:  # a DeepSpeed engine frees its buffers itself
            if type(model).__name__ == "DeepSpeedEngine" and callable(getattr(model, "destroy", None)):
                model.destroy()
        released = release_memory(*objects)
        self._prepared.release()
        self._steppers, self._prepared_for = [], {}
        self.ctx.dataloaders.clear()
        self.ctx.loop.micro_step = 0
        return released

    def clear(self, *objects: Any) -> list:
        """The same as `free_memory` (Accelerate's alias)."""
        return self.free_memory(*objects)

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: Any) -> Iterator[None]:
        """Synchronise gradients in the next backward even inside `no_sync` (a DDP-wrapped model; elsewhere
        nothing to do)."""
        if not all(hasattr(model, a) for a in ("require_backward_grad_sync", "require_forward_param_sync")):
            yield
            return
        old = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = old

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list, even_batches: bool | None = None) -> Iterator[None]:
        """Train on inputs of different lengths per process: processes that run out of data shadow the others'
        collectives (torch's Join). `even_batches` overrides the prepared map-style loaders' setting meanwhile
        (a warning says when some prepared loaders are iterable: those keep theirs)."""
        many = self.num_processes > 1
        shards = [dl._shard for dl in self._dataloaders if getattr(dl, "_shard", None) is not None] if many else []
        saved = [s.even_batches for s in shards]
        if many and even_batches is not None:
            if len(shards) < len(self._dataloaders):
                warnings.warn("Overriding even_batches is only supported for map-style datasets, yet some dataloaders "
                              "given were iterable", stacklevel=3)
            for shard in shards:
                shard.even_batches = even_batches
        try:
            if not many or not all(hasattr(j, "join") for j in joinables):
                if many:
                    warnings.warn("join_uneven_inputs: these models cannot join (not DDP-wrapped); running without "
                                  "Join", stacklevel=3)
                yield
                return
            from torch.distributed.algorithms import Join

            with Join(joinables):
                yield
        finally:
            for shard, value in zip(shards, saved):
                shard.even_batches = value

    @contextlib.contextmanager
    def profile(self, profile_handler: Any = None) -> Iterator[Any]:
        """torch.profiler over the block, configured by `ProfileKwargs` (given here or in kwargs_handlers);
        with its `output_trace_dir`, each process writes `trace_rank_<i>.json` there."""
        from acc.utils.dataclasses import ProfileKwargs

        handler = profile_handler or self.ctx.handler(ProfileKwargs) or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        if getattr(handler, "output_trace_dir", None):
            import os

            os.makedirs(handler.output_trace_dir, exist_ok=True)
            profiler.export_chrome_trace(os.path.join(handler.output_trace_dir,
                                                      f"trace_rank_{self.process_index}.json"))
        self.wait_for_everyone()

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """True when `model` (or a submodule) was dispatched over several devices (`hf_device_map`)."""
        return any(len(getattr(m, "hf_device_map", {}) or {}) > 1 for m in model.modules())

    def end_training(self) -> None:
        """Finish the trackers and release the backend's resources (process groups); call once at the end."""
        if self._tracking is not None:
            self._tracking.finish()
        from acc.checkpointing.files import finish_removals

        finish_removals()  # replaced checkpoints deleted in the background are gone when training ends
        self._runtime.teardown()

    def __deepcopy__(self, memo: dict) -> "Accelerator":
        return self  # one Accelerator per process, as in Accelerate

    @property
    def _token(self) -> str:

        return f"{os.getpid()}:{id(self)}"

    def __reduce__(self) -> tuple:
        """Pickling an Accelerator refers to this process's live one (its process group, prepared objects and
        device cannot travel): unpickling in the same process gives the same object back."""
        return _live_accelerator, (self._token,)

    def __repr__(self) -> str:
        return (f"Accelerator(backend={self.backend!r}, device={self.device}, process {self.process_index} of "
                f"{self.num_processes}, mixed_precision={self.mixed_precision!r})")


_LIVE: "weakref.WeakValueDictionary[str, Accelerator]" = weakref.WeakValueDictionary()


def _discard(items: list, item: Any) -> None:
    if item in items:
        items.remove(item)


class _OptimizerStep:
    """A prepared optimizer's step: its stepper, through the precision (fp16 scaler). Picklable, so the prepared
    optimizer is: the Accelerator pickles as a reference to this process's live one."""

    def __init__(self, accelerator: Accelerator, index: int):
        self.accelerator, self.index = accelerator, index

    def __call__(self, optimizer: Any) -> bool:
        stepper = self.accelerator._steppers[self.index]
        return self.accelerator._precision.step(stepper, stepper.step)


def _live_accelerator(token: str) -> Accelerator:
    found = _LIVE.get(token)
    if found is None:
        raise AccError(f"an Accelerator pickled in process {token.split(':')[0]} can only be unpickled in that process "
                       "while it lives; create an Accelerator in each process instead")
    return found


def _mark_prepared(obj: Any) -> None:
    try:
        obj._is_accelerate_prepared = True
    except (AttributeError, TypeError):
        pass


__all__ = ["Accelerator"]
