"""The prepared optimizer and LR scheduler: they act only on real optimizer steps.

Rules (the same on every backend):
- `optimizer.step()` and `zero_grad()` do nothing on accumulation micro-steps (`sync_gradients` False).
- A step the backend reports as skipped (fp16 overflow) sets `step_was_skipped`.
- A prepared scheduler steps once per applied optimizer step: not per micro-step, not once per process,
  not after a skipped step. (Accelerate steps it once per process by default, which shortens schedules
  when the process count changes; acc does not.)
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .context import LoopState


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps the user's optimizer; all optimizer state stays in the wrapped object (`.optimizer`)."""

    def __init__(self, optimizer: torch.optim.Optimizer, step_fn: Callable[[Any], bool], loop: LoopState):
        # torch.optim.Optimizer.__init__ is deliberately not called: param groups and state are delegated.
        self.optimizer = optimizer
        self._step_fn = step_fn
        self._loop = loop
        self.step_was_skipped = False
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

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._loop.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable | None = None) -> Any:  # type: ignore[override]
        if not self._loop.sync_gradients:
            return None
        if closure is not None:
            raise ValueError("prepared optimizers do not take a closure; compute the loss and call backward first")
        applied = self._step_fn(self.optimizer)
        self.step_was_skipped = applied is False
        if not self.step_was_skipped:
            self._loop.step += 1
        return None

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    def __getstate__(self) -> dict:
        return self.__dict__

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


class AcceleratedScheduler:
    """Wraps an LR scheduler so it advances once per applied optimizer step."""

    def __init__(self, scheduler: Any, optimizers: list[AcceleratedOptimizer], loop: LoopState):
        self.scheduler = scheduler
        self.optimizers = optimizers
        self._loop = loop

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self._loop.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

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
