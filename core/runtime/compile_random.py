"""Inductor with torch's own random numbers: the `compile_random = "eager"` setting.

Inductor's default replaces a model's random ops with its own counter-based generator. On the CPU that generator
makes one Philox draw per element in scalar code. Measured on a transformer block (d_model 256, dropout 0.1, batch
16 x 64, AdamW, one process, quiet machine, a plain script): eager 53-57 ms a step, compiled 79-83 ms, compiled
with dropout 0 45 ms, compiled with this module's backend 58-59 ms. Its masks also differ from the uncompiled
model's for the same seed. (Under `acc launch` the bench row `compile_step` shows a smaller gap: see its note.)

`inductor_eager_random` is inductor with `fallback_random` (random ops run as torch's eager kernels, on torch's
generator) and dropout decomposed as eager dropout is computed: a keep mask from `bernoulli(1 - p)` on an empty
tensor of the input's shape, then the fused `input * mask / (1 - p)`. So a compiled model draws the same masks as
the uncompiled one, and only the draw itself stays outside inductor's fused kernels.

torch is imported inside the functions only.
"""

from __future__ import annotations

from typing import Any


def native_dropout(input: Any, p: float, train: bool | None) -> tuple[Any, Any]:
    """`aten.native_dropout` as eager computes it on the CPU (the keep mask from bernoulli_(1 - p) on a tensor of
    the input's shape), in ops inductor lowers: the draw stays torch's kernel, the scaling fuses."""
    import torch

    if not train or p == 0:
        return input, torch.ones_like(input, dtype=torch.bool)
    if p == 1:
        return torch.zeros_like(input), torch.zeros_like(input, dtype=torch.bool)
    keep = torch.ops.aten.bernoulli.p(torch.empty_like(input), 1.0 - p)
    return input * keep * float(1.0 / (1.0 - p)), keep.to(torch.bool)


def inductor_eager_random(graph: Any, example_inputs: Any, mode: str | None = None,
                          options: dict[str, Any] | None = None) -> Any:
    """A torch.compile backend: inductor (with torch.compile's `mode` and `options` applied as the built-in
    "inductor" backend applies them) whose random ops draw from torch's generator, dropout included."""
    import torch
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.decomposition import select_decomp_table

    patches = {**list_mode_options(mode or "default"), **(options or {}), "fallback_random": True}
    with torch._inductor.config.patch(patches):
        table = dict(select_decomp_table())
    table[torch.ops.aten.native_dropout.default] = native_dropout
    return compile_fx(graph, example_inputs, config_patches=patches, decompositions=table)


__all__ = ["inductor_eager_random", "native_dropout"]
