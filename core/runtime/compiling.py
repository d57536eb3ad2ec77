"""torch.compile of prepared models, in the way each backend needs (`dynamo_backend`, `TorchDynamoPlugin`).

Three ways, chosen after the backend wrapped the models:

- **regional** (`TorchDynamoPlugin(use_regional_compilation=True)`, any backend): the repeated blocks (the
  children of the model's largest `ModuleList`/`Sequential` run of one class, e.g. a transformer's layers) are
  each compiled in place with `module.compile(...)`; identical blocks reuse one compiled graph. A model without
  repeated blocks is refused, not compiled some other way.
- **backend** (`Capabilities(compile="backend")`, e.g. fsdp): the backend compiles its own units inside
  `acc_wrap` through `acc.backend.compile_units(ctx, modules)` (FSDP2: each module `fully_shard` was applied to,
  so its all-gather hooks stay outside the compiled graphs); the kernel leaves the model as `acc_wrap` returned it.
- **model** (the default): the wrapped model is compiled whole with `torch.compile` (under DDP its
  communication hooks then run outside the graph, as torch recommends).

torch is imported inside the functions only.
"""

from __future__ import annotations

from typing import Any

from acc.contract.capabilities import COMPILE_MODELS
from acc.errors import AccError


def compile_options(ctx: Any) -> dict[str, Any] | None:
    """torch.compile's keyword arguments for this run (`backend` and the TorchDynamoPlugin's fields that were
    set), or None when the run does not compile (dynamo_backend unset or "no"). With compile_random = "eager",
    inductor is `acc.runtime.compile_random.inductor_eager_random` (random ops on torch's generator)."""
    backend = ctx.settings.get("dynamo_backend", "no")
    if backend in (None, "no"):
        return None
    plugin = _plugin(ctx)
    options = dict(plugin.to_kwargs()) if plugin is not None else {}
    options["backend"] = backend
    if backend == "inductor" and ctx.settings.get("compile_random", "inductor") == "eager":
        from acc.runtime.compile_random import inductor_eager_random

        options["backend"] = inductor_eager_random
    return options


def regional(ctx: Any) -> bool:
    """Whether the run asks for regional compilation (TorchDynamoPlugin(use_regional_compilation=True))."""
    plugin = _plugin(ctx)
    return bool(plugin is not None and plugin.use_regional_compilation)


def _plugin(ctx: Any) -> Any:
    from acc.compat.plugin_objects import TorchDynamoPlugin

    return ctx.handler(TorchDynamoPlugin)


def compile_in_place(modules: list[Any], options: dict[str, Any]) -> list[Any]:
    """`module.compile(**options)` on each module (nn.Module.compile: the module object, its parameters and its
    state_dict keys stay as they are; its calls go through the compiled graph). Returns the modules."""
    for module in modules:
        if getattr(module, "_compiled_call_impl", None) is None:
            module.compile(**options)
    return list(modules)


def compile_units(ctx: Any, modules: list[Any]) -> list[Any]:
    """For a backend that declares `Capabilities(compile="backend")`: compile `modules` (its units, e.g. the
    modules it sharded) in place with the run's torch.compile options. Call it from `acc_wrap` after wrapping;
    it does nothing (and returns []) when the run does not compile, or when it asks for regional compilation,
    which the kernel then does itself on the model's repeated blocks."""
    options = compile_options(ctx)
    if options is None or regional(ctx):
        return []
    return compile_in_place(modules, options)


def repeated_blocks(model: Any) -> list[Any]:
    """The children of the model's largest run of one class inside a ModuleList or Sequential (ties: the run
    with more parameters, then the first). Empty when no container holds two children of one class."""
    import torch

    best: tuple[int, int] = (1, -1)
    chosen: list[Any] = []
    for module in model.modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        groups: dict[type, list[Any]] = {}
        for child in module.children():
            groups.setdefault(_plain_type(child), []).append(child)
        for blocks in groups.values():
            key = (len(blocks), sum(p.numel() for b in blocks for p in b.parameters()))
            if len(blocks) >= 2 and key > best:
                best, chosen = key, blocks
    return chosen


def _plain_type(module: Any) -> type:
    """The user's class of a module (FSDP2's fully_shard swaps in a subclass per module: FSDPBlock of Block)."""
    mro = type(module).__mro__
    return mro[2] if len(mro) > 2 and mro[1].__name__ == "FSDPModule" else mro[0]


def compile_repeated_blocks(model: Any, options: dict[str, Any]) -> list[Any]:
    """Regional compilation of a prepared model: each repeated block compiled in place (see `repeated_blocks`)."""
    blocks = repeated_blocks(model)
    if not blocks:
        raise AccError(f"TorchDynamoPlugin(use_regional_compilation=True): {type(model).__name__} has no repeated "
                       "blocks (a ModuleList or Sequential holding two or more children of one class) to compile "
                       "one by one; use use_regional_compilation=False to compile the whole model")
    return compile_in_place(blocks, options)


def compile_prepared(ctx: Any, model: Any, capabilities: Any) -> Any:
    """The prepared `model` (as the backend's acc_wrap returned it) compiled the way this run and backend ask."""
    options = compile_options(ctx)
    if options is None or hasattr(model, "_orig_mod"):
        return model
    if regional(ctx):
        compile_repeated_blocks(model, options)
        return model
    if getattr(capabilities, "compile", "model") == "backend":
        return model
    import torch

    return torch.compile(model, **options)


# ---------------------------------------------------------------------------------------------- Accelerate's helpers


def is_repeated_blocks(module: Any) -> bool:
    """Whether `module` is a non-empty ModuleList whose children are all of its first child's class."""
    import torch

    return isinstance(module, torch.nn.ModuleList) and len(module) > 0 and \
        all(isinstance(child, type(module[0])) for child in module)


def has_repeated_blocks(module: Any) -> bool:
    """Whether some submodule of `module` (itself included) is such a ModuleList."""
    return bool(module._modules) and any(is_repeated_blocks(sub) for sub in module.modules())


def compile_regions(module: Any, **compile_kwargs: Any) -> Any:
    """Accelerate's `compile_regions`: a new module in which each block of a repeated ModuleList is compiled on its
    own (`torch.compile(block, **compile_kwargs)`, so identical blocks share the compiler's cache) and every other
    leaf region is compiled whole; `module` itself is unchanged. The copy shares parameters with `module`, keeps
    it as `_orig_mod` (what unwrapping returns), and its methods bound to the instance are bound to the copy."""
    import types

    import torch

    def copy(node: Any) -> Any:
        if is_repeated_blocks(node):
            return torch.nn.ModuleList([torch.compile(block, **compile_kwargs) for block in node])
        if not has_repeated_blocks(node):
            return torch.compile(node, **compile_kwargs)
        twin = type(node).__new__(type(node))
        twin.__dict__.update(node.__dict__)
        for name, value in list(twin.__dict__.items()):
            if isinstance(value, types.MethodType) and value.__self__ is node:
                twin.__dict__[name] = types.MethodType(value.__func__, twin)  # e.g. a forward set on the instance
        twin._modules = {}
        for name, child in node.named_children():
            twin.add_module(name, copy(child))
        return twin

    compiled = copy(module)
    compiled.__dict__.setdefault("_orig_mod", module)
    return compiled


def compile_regions_deepspeed(module: Any, **compile_kwargs: Any) -> None:
    """As `compile_regions`, in place (`module.compile(...)` on each region: the module object stays, so hooks
    added to it later still run), for a DeepSpeed engine's module or a model FSDP2 will shard
    (`compile_regions_fsdp2`, which returns the module)."""
    if is_repeated_blocks(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif has_repeated_blocks(module):
        for child in module.children():
            compile_regions_deepspeed(child, **compile_kwargs)
    else:
        module.compile(**compile_kwargs)


def compile_regions_fsdp2(module: Any, **compile_kwargs: Any) -> Any:
    compile_regions_deepspeed(module, **compile_kwargs)
    return module


compile_regions_fsdp2.__doc__ = compile_regions_deepspeed.__doc__

__all__ = ["COMPILE_MODELS", "compile_in_place", "compile_options", "compile_prepared", "compile_regions",
           "compile_regions_deepspeed", "compile_regions_fsdp2", "compile_repeated_blocks", "has_repeated_blocks", "is_repeated_blocks",
           "compile_units", "regional", "repeated_blocks"]
