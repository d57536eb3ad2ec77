"""The DeepSpeed placeholders of Accelerate (`DummyOptim`, `DummyScheduler`; their public path is
`acc.utils.deepspeed`). Torch-free.

A script whose DeepSpeed config defines an "optimizer" (and a "scheduler") passes these to `prepare` instead of
a torch optimizer and scheduler; the deepspeed backend then builds the engine with the config's optimizer and
scheduler, filling their "auto" values from these objects' arguments as Accelerate does (lr, weight_decay,
warmup_num_steps, total_num_steps, ...). The engine steps its scheduler inside each applied optimizer step, so a
prepared `DummyScheduler`'s `step()` does nothing and its `get_last_lr()`/`state_dict()` are the engine
scheduler's. On any other backend preparing them is an error (`check_prepare`).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from acc.errors import AccError

# the DummyScheduler made for an optimizer (a DummyOptim or a real one), so the backend that builds the engine
# from the optimizer finds the scheduler's arguments too, whichever prepare call the scheduler comes in
_SCHEDULER_OF: "weakref.WeakKeyDictionary[Any, weakref.ref]" = weakref.WeakKeyDictionary()


class DummyOptim:
    """Stands for the optimizer the DeepSpeed config's "optimizer" section defines.

    `params`: the parameters (or parameter groups) to optimise; `lr` and `weight_decay` fill the config's
    "auto" values of `optimizer.params.lr` / `.weight_decay`; other keyword arguments (e.g. `betas`, `eps`) are
    kept in `kwargs` and fill the config's "auto" values of the same name.
    """

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any):
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs

    def step(self, *args: Any, **kwargs: Any) -> None:
        raise AccError(_UNPREPARED.format(name="DummyOptim"))

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        raise AccError(_UNPREPARED.format(name="DummyOptim"))

    def __repr__(self) -> str:
        return f"DummyOptim(lr={self.lr!r}, weight_decay={self.weight_decay!r}, kwargs={self.kwargs!r})"


class DummyScheduler:
    """Stands for the LR scheduler the DeepSpeed config's "scheduler" section defines (or that
    `lr_scheduler_callable(optimizer)` builds).

    `total_num_steps` and `warmup_num_steps` fill the config's "auto" values (`total_num_steps` divided by the
    number of processes unless batches are split, as Accelerate does); `warmup_max_lr` comes from the optimizer's
    lr and `warmup_min_lr` is 0; other keyword arguments fill "auto" values of the same name.
    """

    def __init__(self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0,
                 lr_scheduler_callable: Callable | None = None, **kwargs: Any):
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs
        self._engine_scheduler: Any = None
        try:
            _SCHEDULER_OF[optimizer] = weakref.ref(self)
        except TypeError:  # an optimizer that takes no weak reference: the backend cannot find this scheduler
            pass

    # ------------------------------------------------------------------ once the engine is built
    def _bind(self, scheduler: Any) -> None:
        """The backend hands over the scheduler the engine built (and steps inside its optimizer step)."""
        self._engine_scheduler = scheduler

    @property
    def scheduler(self) -> Any:
        """The engine's scheduler (None until the optimizer was prepared with the model)."""
        return self._engine_scheduler

    def _bound(self) -> Any:
        if self._engine_scheduler is None:
            raise AccError(_UNPREPARED.format(name="DummyScheduler"))
        return self._engine_scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the DeepSpeed engine steps its scheduler inside every applied optimizer step."""
        self._bound()

    def get_last_lr(self) -> list[float]:
        return list(self._bound().get_last_lr())

    def get_lr(self) -> Any:
        return self._bound().get_lr()

    def state_dict(self) -> dict:
        return self._bound().state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._bound().load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_engine_scheduler":
            raise AttributeError(name)
        bound = self.__dict__.get("_engine_scheduler")
        if bound is None:
            raise AttributeError(f"'DummyScheduler' object has no attribute {name!r}")
        return getattr(bound, name)

    def __repr__(self) -> str:
        return (f"DummyScheduler(total_num_steps={self.total_num_steps!r}, warmup_num_steps={self.warmup_num_steps!r}"
                f", lr_scheduler_callable={self.lr_scheduler_callable!r}, kwargs={self.kwargs!r})")


_UNPREPARED = ("{name} is a placeholder for the optimizer and scheduler a DeepSpeed config defines: pass it to "
               "accelerator.prepare together with the model on the deepspeed backend (acc launch --backend deepspeed "
               "--deepspeed-config ds.json)")


def scheduler_for(optimizer: Any) -> DummyScheduler | None:
    """The DummyScheduler made for `optimizer` (still alive), or None."""
    try:
        ref = _SCHEDULER_OF.get(optimizer)
    except TypeError:
        return None
    return ref() if ref is not None else None


def is_placeholder(obj: Any) -> bool:
    return isinstance(obj, (DummyOptim, DummyScheduler))


def check_prepare(objects: Any, backend: str, distributed_type: Any) -> None:
    """Raise when `objects` (what `prepare` was given) hold a DummyOptim or DummyScheduler and this run is not a
    DeepSpeed run: only a backend that builds its optimizer from a DeepSpeed config can replace them."""
    found = [type(o).__name__ for o in objects if is_placeholder(o)]
    if not found:
        return
    kind = str(getattr(distributed_type, "value", distributed_type)).upper()
    if kind == "DEEPSPEED":
        return
    raise AccError(
        f"prepare() got {' and '.join(dict.fromkeys(found))}, a placeholder for the optimizer/scheduler of a DeepSpeed "
        f"config, but this run uses the {backend} backend, which builds no optimizer: use a real optimizer (e.g. "
        "torch.optim.AdamW(model.parameters(), lr=...)) and a torch LR scheduler, or launch with --backend deepspeed "
        "and a --deepspeed-config that defines \"optimizer\" (and \"scheduler\")"
    )


__all__ = ["DummyOptim", "DummyScheduler", "check_prepare"]
