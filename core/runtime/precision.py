"""Mixed precision, the same on every backend: autocast around forward, a gradient scaler for fp16.

- "bf16": `torch.autocast(device_type, torch.bfloat16)` around each prepared model's forward.
- "fp16": autocast with float16 plus a gradient scaler (from the `acc_grad_scaler` hook, by default
  `torch.amp.GradScaler(device_type)`): the loss is scaled before backward, gradients are unscaled
  before clipping and stepping, and a step whose gradients overflowed is skipped and reported.
- Model outputs come back in float32 (opt out with `AutocastKwargs(outputs_float32=False)`).

A mode the device only emulates (bf16 on a CPU without avx512_bf16/amx_bf16, a GPU without bf16) is warned
about once when the run's `Precision` is made (`acc.runtime.precision_support`).

A backend that implements precision itself (DeepSpeed, XLA) sets `ProcessInfo.native_precision`; the
kernel then leaves models, losses and steps alone.

Why kernel code and not a wrapper plugin: a pluggy wrapper can neither replace the loss a backward
hook receives nor skip the inner optimizer step on overflow, and both are what fp16 needs.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import torch

from acc.errors import AccError
from acc.runtime.ops import apply
from acc.runtime.precision_support import warn_if_emulated

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def check_supported(mode: str, device: torch.device) -> None:
    """Raise AccError at setup when `mode` cannot run on `device` (instead of failing mid-training)."""
    if mode == "no":
        return
    kind = device.type
    if not torch.amp.is_autocast_available(kind):
        raise AccError(f"mixed_precision '{mode}' needs autocast on device '{kind}', which this torch "
                       f"({torch.__version__}) does not provide; use mixed_precision 'no'")
    if kind == "cuda" and mode == "bf16" and not torch.cuda.is_bf16_supported():
        raise AccError(f"mixed_precision 'bf16' is not supported by {torch.cuda.get_device_name(device)} "
                       "(needs compute capability 8.0+); use 'fp16' or 'no'")
    try:  # the cheapest honest check: one autocast matmul on the device
        with torch.autocast(kind, dtype=DTYPES[mode]):
            x = torch.ones(2, 2, device=device)
            (x @ x).sum().item()
    except Exception as exc:  # noqa: BLE001 - any failure here means the mode is unusable on this device
        raise AccError(f"mixed_precision '{mode}' does not work on device '{device}': {type(exc).__name__}: "
                       f"{exc}; use mixed_precision 'no'") from None


def _to_float32(data: Any) -> Any:
    return apply(lambda t: t.float() if t.is_floating_point() and t.dtype in (torch.float16, torch.bfloat16) else t,
                 data)


class Precision:
    """Per-run mixed-precision state: the mode, the autocast recipe and (fp16) the gradient scaler."""

    def __init__(self, mode: str, device: torch.device, native: bool = False, scaler: Any = None,
                 autocast_kwargs: Any = None):
        self.mode = mode
        self.device = device
        self.native = native
        self.active = mode != "no" and not native
        self.scaler = scaler if (self.active and mode == "fp16") else None
        ak = autocast_kwargs
        self.enabled = True if ak is None else ak.enabled
        self.cache_enabled = None if ak is None else ak.cache_enabled
        self.outputs_float32 = True if ak is None else ak.outputs_float32
        self._unscaled: set[int] = set()
        if mode != "no":  # also when the backend applies it itself: the device computes in this dtype either way
            warn_if_emulated(mode, device)

    # -- forward
    def autocast(self, handler: Any = None) -> contextlib.AbstractContextManager:
        """The autocast context of this run (a null context without mixed precision); an `AutocastKwargs`
        `handler` overrides the run's for this context."""
        enabled = self.enabled if handler is None else (self.enabled and handler.enabled)
        cache = self.cache_enabled if handler is None else handler.cache_enabled
        if not self.active or not enabled:
            return contextlib.nullcontext()
        kwargs = {} if cache is None else {"cache_enabled": cache}
        return torch.autocast(self.device.type, dtype=DTYPES[self.mode], **kwargs)

    def patch_forward(self, model: torch.nn.Module) -> None:
        """Run `model`'s forward under autocast, outputs in float32 (idempotent; undone by `unpatch`)."""
        if not self.active or "_acc_original_forward" in model.__dict__:
            return
        original = model.forward
        outputs_float32 = self.outputs_float32

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            with self.autocast():
                out = original(*args, **kwargs)
            return _to_float32(out) if outputs_float32 else out

        model.__dict__["_acc_original_forward"] = original
        model.forward = forward  # type: ignore[method-assign]

    @staticmethod
    def unpatch(model: torch.nn.Module) -> None:
        original = model.__dict__.pop("_acc_original_forward", None)
        if original is not None:
            if getattr(original, "__self__", None) is model:
                del model.forward  # back to the class's method
            else:
                model.forward = original  # type: ignore[method-assign]

    # -- backward and step (fp16)
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale(self, optimizer: Any) -> None:
        """Unscale `optimizer`'s gradients once per step (before clipping or stepping)."""
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def step(self, optimizer: Any, do_step: Callable[[], Any]) -> bool:
        """Step through the scaler (fp16) or directly; returns False when the step was skipped."""
        if self.scaler is None:
            return do_step() is not False
        self.unscale(optimizer)
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)  # calls optimizer.step() (-> do_step) unless gradients overflowed
        self.scaler.update()
        self._unscaled.discard(id(optimizer))
        return not self.scaler.get_scale() < before


class BackendStepper:
    """What the gradient scaler steps: the user's optimizer's param groups, stepped through the backend hook.

    GradScaler keys its per-optimizer state by object identity, so each prepared optimizer keeps one.
    """

    def __init__(self, optimizer: Any, step: Callable[[Any], Any]):
        self.optimizer = optimizer
        self._step = step

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def step(self, *args: Any, **kwargs: Any) -> Any:
        return self._step(self.optimizer)
