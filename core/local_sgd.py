"""Local SGD (Accelerate's `accelerate.local_sgd.LocalSGD`): each process trains on its own for a number of
steps, gradients not synchronised, and the model parameters are averaged across processes every
`local_sgd_steps` steps and when the block ends.

    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in loader:
            loss = compute_loss(model, batch)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()

Only the `Accelerator`'s public methods are used (`no_sync`, `reduce`, `wait_for_everyone`, `autocast`).
"""

from __future__ import annotations

import contextlib
from typing import Any

# Accelerate's list: data-parallel replicas that own whole models (no sharding, no engine of its own)
_SUPPORTED = {"no", "multi_cpu", "multi_gpu", "multi_xpu", "multi_mlu", "multi_hpu", "multi_sdaa", "multi_musa",
              "multi_npu", "multi_neuron"}


def _kind(distributed_type: Any) -> str:
    return str(getattr(distributed_type, "value", distributed_type)).lower()


class LocalSGD:
    """Runs `local_sgd_steps` updates independently on each process, then averages the parameters.

    Inside the `with` block the model runs under `accelerator.no_sync(model)`; `step()` counts one update
    and averages every `local_sgd_steps`-th; leaving the block averages once more. With one process
    (or `enabled=False`) it does nothing. Sharded backends (fsdp, deepspeed, xla) are refused, as in
    Accelerate.
    """

    def __init__(self, accelerator: Any, model: Any, local_sgd_steps: int, enabled: bool = True):
        kind = _kind(accelerator.distributed_type)
        if kind not in _SUPPORTED:
            raise NotImplementedError(f"LocalSGD is supported only for data-parallel CPU and GPU processes, not for "
                                      f"distributed_type {kind!r} (no FSDP, DeepSpeed or XLA)")
        if local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps must be at least 1, got {local_sgd_steps}")
        self.enabled = bool(enabled) and kind != "no" and accelerator.num_processes > 1
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: contextlib.ExitStack | None = None

    def __enter__(self) -> "LocalSGD":
        if self.enabled:
            self._no_sync = contextlib.ExitStack()
            self._no_sync.enter_context(self.accelerator.no_sync(self.model))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.enabled and self._no_sync is not None:
            try:
                if exc_type is None:  # an exception on one process must not leave the others in a collective
                    self._sync_and_avg_model_params()
            finally:
                self._no_sync.__exit__(exc_type, exc, tb)
                self._no_sync = None

    def step(self) -> None:
        """Count one update; every `local_sgd_steps`-th averages the parameters across processes."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        self.accelerator.wait_for_everyone()
        with self.accelerator.autocast():
            for param in self.model.parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")


__all__ = ["LocalSGD"]
