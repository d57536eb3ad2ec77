"""The facade users call. Names and meaning follow Hugging Face Accelerate, so migrating is one import.

This is the only worker-side caller of `pm.hook.*`: every collective, wrap, backward and step goes
through a hook, so a backend changes behaviour without the facade knowing which backend runs.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any, Callable, Iterator

import pluggy
import torch

from . import lifecycle
from .assembly import Assembly, assemble_worker
from .checkpoint import ProjectConfiguration
from .collectives import CollectivesMixin
from .context import RunContext
from .data import PreparedDataLoader
from .errors import AccError
from .kwargs import AutocastKwargs, GradScalerKwargs
from .optim import AcceleratedOptimizer, AcceleratedScheduler
from .plugins import fast_caller
from .precision import BackendStepper, Precision, check_supported
from .saving import SavingMixin

_SCHEDULER_TYPES: tuple[type, ...] = (torch.optim.lr_scheduler.LRScheduler,)
if hasattr(torch.optim.lr_scheduler, "ReduceLROnPlateau"):
    _SCHEDULER_TYPES += (torch.optim.lr_scheduler.ReduceLROnPlateau,)


class Accelerator(CollectivesMixin, SavingMixin):
    """Runs one training loop on whichever backend the launch (or `ACC_BACKEND`, or a config file) chose.

    Arguments given here override the launch settings (a warning says so when they contradict a value
    that was set explicitly). `plugin_manager` is for tests and embedding: a ready pluggy manager.
    """

    def __init__(
        self,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool | None = None,
        *,
        split_batches: bool = False,
        even_batches: bool = True,
        device_placement: bool = True,
        kwargs_handlers: list | None = None,
        project_dir: str | None = None,
        project_config: ProjectConfiguration | None = None,
        plugin_manager: pluggy.PluginManager | None = None,
    ):
        assembly = assemble_worker(pm=plugin_manager)
        settings = assembly.settings
        for name, value in (
            ("mixed_precision", mixed_precision),
            ("gradient_accumulation_steps", gradient_accumulation_steps),
            ("cpu", cpu),
        ):
            if value is None:
                continue
            setting = assembly.registry[name]
            try:
                value = setting.convert(value)
            except ValueError as exc:
                raise AccError(f"Accelerator({name}={value!r}): {exc}") from None
            if not settings.is_default(name) and settings[name] != value:
                warnings.warn(
                    f"Accelerator({name}={value!r}) overrides {name}={settings[name]!r} from "
                    f"{settings.source(name)}", stacklevel=2,
                )
            settings = settings.override(name, value, f"code Accelerator({name}=...)")
        self._assembly: Assembly = assembly
        self._pm = assembly.pm
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.device_placement = device_placement
        self.ctx = RunContext(settings=settings, backend=settings["backend"],
                              kwargs_handlers=list(kwargs_handlers or []))
        info = self._pm.hook.acc_setup(ctx=self.ctx)
        if info is None:
            raise AccError(f"no plugin answered acc_setup for backend '{self.ctx.backend}'")
        self.ctx.process = info
        lifecycle.install(self.end_training)
        self._precision = self._make_precision()
        self._backward_hook = fast_caller(self._pm, "acc_backward")
        self._models: list[Any] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[PreparedDataLoader] = []
        self._steppers: list[BackendStepper] = []
        self._prepared_for: dict[int, AcceleratedOptimizer] = {}
        self._custom_objects: list[Any] = []
        self.project_configuration = project_config or ProjectConfiguration()
        if project_dir is not None:
            self.project_configuration.project_dir = str(project_dir)
        self._micro_step = 0
        self._ended = False

    def _make_precision(self) -> Precision:
        mode, info = self.mixed_precision, self.ctx.process
        if info.native_precision:
            return Precision(mode, info.device, native=True)
        check_supported(mode, info.device)
        scaler = None
        if mode == "fp16":
            handler = self.ctx.handler(GradScalerKwargs)
            scaler = self._pm.hook.acc_grad_scaler(ctx=self.ctx, kwargs=handler.to_kwargs() if handler else {})
        return Precision(mode, info.device, scaler=scaler, autocast_kwargs=self.ctx.handler(AutocastKwargs))

    # ------------------------------------------------------------------ facts
    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def run_dir(self) -> str | None:
        """The launch's run directory (its manifest.json), when started by `acc launch`."""
        import os

        return os.environ.get("ACC_RUN_DIR")

    @property
    def settings(self) -> Any:
        return self.ctx.settings

    @property
    def backend(self) -> str:
        return self.ctx.backend

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    @property
    def num_processes(self) -> int:
        return self.ctx.num_processes

    @property
    def process_index(self) -> int:
        return self.ctx.process_index

    @property
    def local_process_index(self) -> int:
        return self.ctx.local_process_index

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def distributed_type(self) -> str:
        return self.ctx.process.distributed_type

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def mixed_precision(self) -> str:
        return self.settings["mixed_precision"]

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.settings["gradient_accumulation_steps"]

    @property
    def sync_gradients(self) -> bool:
        return self.ctx.loop.sync_gradients

    @property
    def step(self) -> int:
        """Optimizer steps applied so far."""
        return self.ctx.loop.step

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when the last optimizer step was skipped (fp16 gradients overflowed)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    @property
    def scaler(self) -> Any:
        """The fp16 gradient scaler, or None."""
        return self._precision.scaler

    def autocast(self) -> contextlib.AbstractContextManager:
        """This run's autocast context, for code outside the prepared models' forward (e.g. a loss)."""
        return self._precision.autocast()

    # ------------------------------------------------------------------ prepare
    def prepare(self, *objects: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and LR schedulers for this backend; returned in order.

        Anything else is returned unchanged. Data loaders come first (a backend may need their batch size),
        then models and optimizers of the call together (a sharding backend rebinds optimizers to sharded
        parameters), then schedulers.
        """
        if device_placement is not None and len(device_placement) != len(objects):
            raise ValueError(f"device_placement has {len(device_placement)} entries for {len(objects)} objects")
        placement = device_placement or [self.device_placement] * len(objects)
        result: list[Any] = list(objects)
        model_idx = [i for i, o in enumerate(objects) if isinstance(o, torch.nn.Module)]
        opt_idx = [i for i, o in enumerate(objects) if isinstance(o, torch.optim.Optimizer)]
        for i in opt_idx:
            if isinstance(objects[i], AcceleratedOptimizer):
                raise ValueError(f"object #{i} is an optimizer that was already prepared; prepare each object once")
        for i, obj in enumerate(objects):
            if isinstance(obj, torch.utils.data.DataLoader):
                result[i] = self.prepare_data_loader(obj, device_placement=placement[i])
        if model_idx or opt_idx:
            models = []
            for i in model_idx:
                model = objects[i]
                if placement[i] and self.device is not None:
                    model = model.to(self.device)
                self._precision.patch_forward(model)
                models.append(model)
            raw_opts = [objects[i] for i in opt_idx]
            wrapped_models, wrapped_opts = self._pm.hook.acc_wrap(ctx=self.ctx, models=models, optimizers=raw_opts)
            if len(wrapped_models) != len(models) or len(wrapped_opts) != len(raw_opts):
                raise AccError(f"backend '{self.backend}' answered acc_wrap with the wrong number of objects")
            for i, m in zip(model_idx, wrapped_models):
                result[i] = m
                self._models.append(m)
            for i, old, new in zip(opt_idx, raw_opts, wrapped_opts):
                if placement[i]:
                    _move_optimizer_state(new, self.device)
                result[i] = AcceleratedOptimizer(new, self._step_function(new), self.ctx.loop)
                self._optimizers.append(result[i])
                self._prepared_for[id(old)] = result[i]  # a scheduler built on the user's optimizer finds it
        for i, obj in enumerate(objects):
            if isinstance(obj, _SCHEDULER_TYPES):
                result[i] = self.prepare_scheduler(obj)
        return result[0] if len(result) == 1 else tuple(result)

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None) -> torch.nn.Module:
        return self.prepare(model, device_placement=None if device_placement is None else [device_placement])

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        return self.prepare(optimizer)

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        owners = [o for o in self._optimizers if scheduler.optimizer in (o, o.optimizer)]
        if not owners and id(scheduler.optimizer) in self._prepared_for:
            owners = [self._prepared_for[id(scheduler.optimizer)]]
        if not owners:
            raise ValueError("prepare the scheduler's optimizer first (or in the same prepare call)")
        prepared = AcceleratedScheduler(scheduler, owners, self.ctx.loop)
        self._schedulers.append(prepared)
        return prepared

    def prepare_data_loader(self, loader: torch.utils.data.DataLoader, device_placement: bool | None = None) -> Any:
        place = self.device_placement if device_placement is None else device_placement
        seed = _shuffle_seed(loader)
        if self.num_processes > 1:
            seed = self.broadcast_object(seed, from_process=0)
        prepared = PreparedDataLoader(
            loader,
            num_processes=self.num_processes,
            process_index=self.process_index,
            device=self.device if place else None,
            seed=seed,
            split_batches=self.split_batches,
            even_batches=self.even_batches,
            on_start=self.ctx.loop.active_loaders.append,
            on_end=lambda dl: self.ctx.loop.active_loaders.remove(dl) if dl in self.ctx.loop.active_loaders else None,
        )
        self._dataloaders.append(prepared)
        self.ctx.dataloaders.append(prepared)
        return self._pm.hook.acc_wrap_dataloader(ctx=self.ctx, loader=prepared)

    # ------------------------------------------------------------------ training step
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backpropagate `loss`, divided by the accumulation steps, scaled for fp16."""
        if self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        loss = self._precision.scale_loss(loss)
        self._backward_hook(ctx=self.ctx, loss=loss, kwargs=kwargs)

    def _step_function(self, optimizer: Any) -> Callable[[Any], bool]:
        """The prepared optimizer's step: through the scaler (fp16) to the backend's step hook."""
        step_hook = fast_caller(self._pm, "acc_optimizer_step")
        stepper = BackendStepper(optimizer, lambda opt: step_hook(ctx=self.ctx, optimizer=opt))
        self._steppers.append(stepper)
        return lambda opt: self._precision.step(stepper, lambda: stepper.step())

    @contextlib.contextmanager
    def accumulate(self, *models: Any) -> Iterator[None]:
        """One micro-step: gradients sync (and the optimizer steps) every k-th call and at the end of data."""
        self._micro_step += 1
        loop = self.ctx.loop
        if loop.end_of_dataloader:
            loop.sync_gradients, self._micro_step = True, 0
        else:
            loop.sync_gradients = self._micro_step % self.gradient_accumulation_steps == 0
        with contextlib.ExitStack() as stack:
            if not loop.sync_gradients:
                for model in models:
                    stack.enter_context(self._pm.hook.acc_no_sync(ctx=self.ctx, model=model))
            yield

    @contextlib.contextmanager
    def no_sync(self, model: Any) -> Iterator[None]:
        """Backward inside this context does not synchronise gradients across processes."""
        with self._pm.hook.acc_no_sync(ctx=self.ctx, model=model):
            yield

    def _unscale_all(self) -> None:
        for stepper in self._steppers:
            self._precision.unscale(stepper)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """Clip the total gradient norm across all processes (fp16 gradients unscaled first); returns it.

        On accumulation micro-steps (`sync_gradients` False) it does nothing and returns None: the
        gradients are not complete yet, so their norm means nothing.
        """
        if not self.sync_gradients:
            return None
        self._unscale_all()
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        return self._pm.hook.acc_clip_grad_norm(ctx=self.ctx, parameters=params, max_norm=max_norm,
                                               norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clamp every gradient to [-clip_value, clip_value] (fp16 gradients unscaled first)."""
        if not self.sync_gradients:
            return
        self._unscale_all()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def unwrap_model(self, model: Any, keep_fp32_wrapper: bool = True) -> Any:
        """The user's module without the backend's wrapper (and without the autocast forward, if asked)."""
        inner = self._pm.hook.acc_unwrap_model(ctx=self.ctx, model=model)
        if not keep_fp32_wrapper:
            Precision.unpatch(inner)
        return inner

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first (e.g. to download or preprocess), then the others."""
        with self._first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        with self._first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _first(self, leader: bool) -> Iterator[None]:
        if not leader:
            self.wait_for_everyone()
        yield
        if leader:
            self.wait_for_everyone()

    def on_main_process(self, fn: Callable) -> Callable:
        """Decorator: run `fn` on the main process only (returns None elsewhere)."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs) if self.is_main_process else None

        return wrapper

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def end_training(self) -> None:
        """Release the backend's resources (process groups); call once at the end of the script."""
        if not self._ended:
            self._ended = True
            self._pm.hook.acc_teardown(ctx=self.ctx)

    def __repr__(self) -> str:
        return (f"Accelerator(backend={self.backend!r}, device={self.device}, process {self.process_index} of "
                f"{self.num_processes}, mixed_precision={self.mixed_precision!r})")


def _shuffle_seed(loader: Any) -> int:
    """A seed for the loader's shuffling: its own generator's, else torch's initial seed (set_seed sets it)."""
    sampler = getattr(loader, "sampler", None)
    gen = getattr(sampler, "generator", None) or getattr(loader, "generator", None)
    seed = gen.initial_seed() if gen is not None else torch.initial_seed()
    return int(seed) % (2**63)


def _move_optimizer_state(optimizer: Any, device: Any) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.device != device and key != "step":
                state[key] = value.to(device)


__all__ = ["Accelerator"]
