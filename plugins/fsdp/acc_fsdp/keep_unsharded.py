"""How many of the last units stay gathered between forward and backward (the fsdp_keep_unsharded setting).

Backward needs the last units first, so a unit kept gathered after forward is not all-gathered (and copied out of
the all-gather buffer) again when backward starts. Each kept unit holds its whole parameters from the end of
forward until its own backward: that costs peak memory only where it rises above the peak that backward reaches
later anyway, when the gradient shards of the other units have piled up. Measured on the bench model (8 units of
25 MB, AdamW, 2 processes on gloo, `MALLOC_MMAP_THRESHOLD_=65536`): peak RSS per rank 694 MB keeping 1 or 4 units,
706 MB keeping 5, 729 MB keeping 6, 777 MB keeping all 8 (shard_grad_op's); warm steps ~0.72 s keeping 1, ~0.65 s
keeping 4 (medians of 8 steps, 3 launches each).

`auto` (the default) decides at the first training step, from what it measures there. With A the activations
saved for backward (counted once per storage, parameters left out), U the largest unit's gathered parameters, N the
units and G the gradient shards of every unit but the first (each unit's gradient bytes over the shard group's
size), memory above the sharded state is about A + (K + 2) U when backward starts (K kept units, the first unit's
whole gradients and its reduce-scatter input) and A / N + 3 U + G at the first unit's backward, the last to run.
K = 1 + floor((A / N + G - A) / U) keeps the first below the second: at least 1 (what acc kept before: the last
unit, which backward gathers at once anyway), at most N. So a model whose activations outweigh its gradient shards
keeps 1, and the bench model keeps 4. The first step itself runs with 1; a compiled model keeps 1 (its saved
tensors are not counted here). An integer sets K; fsdp_keep_last_unsharded false (`--no-fsdp-keep-last-unsharded`)
keeps none.
"""

from __future__ import annotations

from typing import Any

from acc import backend as sdk

CHOICES = "auto, or a number of units (0, 1, 2, ...)"


def parse(value: str) -> int | None:
    """The kept-unit count `value` asks for, None for auto; ValueError naming the valid values."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    if text.isdigit():
        return int(text)
    raise ValueError(f"fsdp_keep_unsharded {value!r}: expected {CHOICES}")


def choose(activations: int, unit_bytes: list[int], grad_shard_bytes: list[int]) -> int:
    """K for `auto` (see the module docstring): units in forward order, each one's gathered parameter bytes and
    its gradient shard's bytes."""
    n = len(unit_bytes)
    if n == 0:
        return 0
    largest = max(unit_bytes)
    if largest <= 0:
        return 1
    headroom = activations / n + sum(grad_shard_bytes[1:]) - activations
    return max(1, min(n, 1 + int(headroom // largest)))


class KeepUnsharded:
    """The kept units of one sharded model: set at prepare (an explicit count, or 1 until `auto` has measured), then,
    for `auto`, measured over the first training step (from the root's forward until backward starts) and set for
    the steps after it. A forward without gradients (evaluation) reshards a kept unit at once."""

    def __init__(self, ctx: sdk.RunContext, model: Any, units: list[Any]) -> None:
        self.ctx, self.model, self.units = ctx, model, units
        wanted = parse(ctx.settings["fsdp_keep_unsharded"])
        if not ctx.settings["fsdp_keep_last_unsharded"]:
            wanted = 0
        self.auto = wanted is None
        self.count = 0
        self.measured: dict[str, Any] | None = None
        self._hooks: Any = None
        self._seen: set[int] = set()
        self._activations = 0
        for unit in units:
            unit.register_forward_hook(self._reshard_without_backward)
        self.keep(min(1 if wanted is None else wanted, len(units)))
        if self.auto and len(units) > 1:
            self._pre = model.register_forward_pre_hook(self._start)

    def keep(self, count: int) -> None:
        """Keep the last `count` units gathered after forward; reshard the others."""
        self.count = count
        for i, unit in enumerate(self.units):
            unit.set_reshard_after_forward(i < len(self.units) - count, recurse=False)
        self.ctx.backend_state["keep_unsharded"] = count

    def _kept(self, unit: Any) -> bool:
        return self.units.index(unit) >= len(self.units) - self.count

    def _reshard_without_backward(self, module: Any, args: Any, output: Any) -> None:
        import torch

        if not torch.is_grad_enabled() and self._kept(module):
            module.reshard()

    # -- auto: the first training step's measurement
    def _start(self, module: Any, args: Any) -> None:
        import torch

        if self._hooks is not None:  # a second forward before any backward: decide on what the first saved
            self.backward_starts()
            return
        if not torch.is_grad_enabled():
            return
        self._pre.remove()
        if any(getattr(m, "_compiled_call_impl", None) is not None for m in [module, *self.units]):
            self.measured = {"skipped": "compiled"}
            return
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda saved: saved)
        self._hooks.__enter__()
        self._next = module.register_forward_pre_hook(self._start)

    def _pack(self, tensor: Any) -> Any:
        base = getattr(tensor, "_base", None)
        base = tensor if base is None else base
        if not (base.is_leaf and base.requires_grad):  # parameters (and views of them) are not activations
            local = getattr(tensor, "_local_tensor", tensor)  # a DTensor's own storage is its local shard's
            try:
                storage = local.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
            except (RuntimeError, NotImplementedError):  # a tensor subclass without a storage of its own
                key, size = id(tensor), local.numel() * local.element_size()
            if key not in self._seen:
                self._seen.add(key)
                self._activations += size
        return tensor

    def backward_starts(self) -> None:
        """End the measurement (if one runs) and keep the units `choose` gives from the next step on."""
        if self._hooks is None:
            return
        self._hooks.__exit__(None, None, None)
        self._hooks = None
        self._next.remove()
        units, grads = [], []
        for unit in self.units:
            group = unit._get_fsdp_state()._fsdp_param_group  # FSDP2's record of the unit's parameters
            shards = [fp.sharded_param for fp in group.fsdp_params] if group is not None else []
            numel = sum(p.numel() for p in shards)  # a DTensor's numel is the whole parameter's
            local = sum(p.to_local().numel() for p in shards)
            stored = shards[0].element_size() if shards else 4  # sharded parameters and gradients: their dtype
            gathered = getattr(group.mp_policy, "param_dtype", None) if group is not None else None
            units.append(numel * (gathered.itemsize if gathered is not None else stored))
            grads.append(local * stored)
        count = choose(self._activations, units, grads)
        self.measured = {"activations": self._activations, "unit_bytes": units, "grad_shard_bytes": grads,
                         "kept": count}
        self.ctx.backend_state["keep_unsharded_measured"] = self.measured
        self._seen.clear()
        self.keep(count)
