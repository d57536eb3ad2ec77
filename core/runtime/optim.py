"""The prepared optimizer and LR scheduler: they act only on real optimizer steps.

Rules (the same on every backend):
- `optimizer.step()` and `zero_grad()` do nothing on accumulation micro-steps (`sync_gradients` False).
- A step the backend reports as skipped (fp16 overflow) sets `step_was_skipped`.
- A prepared scheduler never steps on a micro-step or after a skipped step. On an applied step it steps as the
  `scheduler_stepping` setting says: `per_process` (the default, Accelerate's) steps it `num_processes` times
  (once with `split_batches`), because scripts written for Accelerate size their schedules for that; `once`
  (acc's) steps it once, so a schedule means the same on any number of processes; `every_call` steps it at every
  `scheduler.step()` (Accelerate's `step_scheduler_with_optimizer=False`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch

from acc.contract.context import LoopState


@functools.lru_cache(maxsize=64)
def _signature_has_set_to_none(function: Callable) -> bool:
    return "set_to_none" in inspect.signature(function).parameters


def _takes_set_to_none(zero_grad: Callable) -> bool:
    """Whether `zero_grad` accepts `set_to_none`; read once per function (inspect.signature costs ~20 us, and
    zero_grad runs every step)."""
    function = getattr(zero_grad, "__func__", None)
    if function is None:
        return "set_to_none" in inspect.signature(zero_grad).parameters
    return _signature_has_set_to_none(function)


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps the user's optimizer; all optimizer state stays in the wrapped object (`.optimizer`)."""

    def __init__(self, optimizer: torch.optim.Optimizer, step_fn: Callable[[Any], bool], loop: LoopState):
        # torch.optim.Optimizer.__init__ is deliberately not called: param groups and state are delegated.
        self.optimizer = optimizer
        self._step_fn = step_fn
        self._loop = loop
        self._is_overflow = False  # Accelerate's attribute behind step_was_skipped (its tests set it)
        self.defaults = getattr(optimizer, "defaults", {})

    @property
    def param_groups(self) -> list[dict]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        if self._loop.sync_gradients:
            if _takes_set_to_none(self.optimizer.zero_grad):
                self.optimizer.zero_grad(set_to_none=True if set_to_none is None else set_to_none)
            elif set_to_none is not None:
                raise ValueError(f"{type(self.optimizer).__name__}.zero_grad takes no set_to_none argument")
            else:
                self.optimizer.zero_grad()

    def step(self, closure: Callable | None = None) -> Any:  # type: ignore[override]
        if not self._loop.sync_gradients:
            return None
        if closure is not None:
            raise ValueError("prepared optimizers do not take a closure; compute the loss and call backward first")
        applied = self._step_fn(self.optimizer)
        self._is_overflow = applied is False
        if not self._is_overflow:
            self._loop.step += 1
        return None

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last step was skipped (fp16 gradients overflowed)."""
        return self._is_overflow

    def train(self) -> None:
        """Train mode for optimizers that have one (schedule-free optimizers)."""
        if callable(getattr(self.optimizer, "train", None)):
            self.optimizer.train()

    def eval(self) -> None:
        """Eval mode for optimizers that have one (schedule-free optimizers)."""
        if callable(getattr(self.optimizer, "eval", None)):
            self.optimizer.eval()

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    def __getstate__(self) -> dict:
        return self.__dict__

    def __setstate__(self, state: dict) -> None:  # not torch.optim.Optimizer's: the state is the wrapper's own
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


class AcceleratedScheduler:
    """Wraps an LR scheduler so it advances with the applied optimizer steps (see the module's rules)."""

    def __init__(self, scheduler: Any, optimizers: list[AcceleratedOptimizer], loop: LoopState,
                 stepping: str = "per_process", num_processes: int = 1, split_batches: bool = False,
                 adjust_scheduler: bool = True):
        self.scheduler = scheduler
        self.optimizers = optimizers
        self._loop = loop
        self.stepping = stepping
        self.split_batches = split_batches
        self.adjust_scheduler = adjust_scheduler
        self._steps = 1 if (stepping != "per_process" or split_batches) else num_processes

    @property
    def step_with_optimizer(self) -> bool:
        return self.stepping != "every_call"

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self.stepping == "every_call":
            self.scheduler.step(*args, **kwargs)
            return
        if not self._loop.sync_gradients:
            if self.adjust_scheduler and hasattr(self.scheduler, "_step_count"):
                self.scheduler._step_count += 1  # micro-steps count towards the scheduler's steps, as in Accelerate
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR raises past its end
        for _ in range(self._steps):
            if total is not None and self.scheduler._step_count > total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":  # not yet set (during unpickling)
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"


def move_optimizer_state(optimizer: Any, device: Any) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.device != device and key != "step":
                state[key] = value.to(device)


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """Accelerate's wrapper of a scheduler that DeepSpeed's engine steps itself (with its optimizer step): `step()`
    does nothing, so the schedule is not advanced twice. Libraries build it or check for it (transformers' Trainer
    skips saving and loading such a scheduler's state: DeepSpeed's checkpoint holds it)."""

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        super().__init__(scheduler, list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers],
                         LoopState())

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None
