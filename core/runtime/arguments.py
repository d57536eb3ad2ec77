"""`Accelerator(...)`'s arguments read into what the run needs: the settings given in code (they override the
launch settings, with a warning where they contradict one set explicitly), the kwargs handlers, the backend plugin
objects (Accelerate's `DeepSpeedPlugin`, `FullyShardedDataParallelPlugin`); each bad combination is an error that
names the arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from acc.contract.kwargs import DataLoaderConfiguration, GradientAccumulationPlugin
from acc.errors import AccError


@dataclass
class Arguments:
    """What `read_arguments` found: `code` maps setting names to values (None: not given)."""

    code: dict[str, Any]
    handlers: list
    backend_plugins: list
    gradient_accumulation_plugin: GradientAccumulationPlugin
    dataloader_config: DataLoaderConfiguration
    parallelism_config: Any = None


def read_arguments(*, mixed_precision: str | None, gradient_accumulation_steps: int | None, cpu: bool | None,
                   dataloader_config: DataLoaderConfiguration | None, deepspeed_plugin: Any, fsdp_plugin: Any,
                   torch_tp_plugin: Any, megatron_lm_plugin: Any,
                   gradient_accumulation_plugin: GradientAccumulationPlugin | None,
                   step_scheduler_with_optimizer: bool | None, kwargs_handlers: list | None, dynamo_backend: Any,
                   dynamo_plugin: Any, deepspeed_plugins: Any, parallelism_config: Any,
                   semantics: str | None) -> Arguments:
    """Check the Accelerator's arguments and read them (see the module docstring)."""
    _refuse_unsupported(torch_tp_plugin=torch_tp_plugin, megatron_lm_plugin=megatron_lm_plugin)
    if deepspeed_plugin is not None and deepspeed_plugins is not None:
        raise ValueError("give either deepspeed_plugin or deepspeed_plugins, not both")
    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ValueError("give either dynamo_backend or dynamo_plugin, not both")
    if isinstance(deepspeed_plugins, dict):
        if len(deepspeed_plugins) != 1:
            raise AccError(f"Accelerator(deepspeed_plugins=...): acc runs one DeepSpeed configuration per run, got "
                           f"{len(deepspeed_plugins)} ({', '.join(deepspeed_plugins)})")
        deepspeed_plugins = next(iter(deepspeed_plugins.values()))
    if gradient_accumulation_plugin is not None:
        if gradient_accumulation_steps not in (None, 1):
            raise ValueError("give either gradient_accumulation_steps or gradient_accumulation_plugin, not both "
                             f"(got {gradient_accumulation_steps} and {gradient_accumulation_plugin})")
        gradient_accumulation_steps = gradient_accumulation_plugin.num_steps
    dataloader_config = dataloader_config or DataLoaderConfiguration()
    code = {
        "semantics": semantics,
        "mixed_precision": mixed_precision,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "cpu": cpu,
        "scheduler_stepping": None if step_scheduler_with_optimizer in (None, True) else "every_call",
        "dynamo_backend": _dynamo_backend(dynamo_backend, dynamo_plugin),
        **_dataloader_config_settings(dataloader_config),
    }
    handlers = list(kwargs_handlers or [])
    _check_handlers(handlers)
    if dynamo_plugin is not None:  # torch.compile's options, for the kernel and backends (ctx.handler)
        handlers.append(dynamo_plugin)
    backend_plugins = [p for p in (deepspeed_plugin or deepspeed_plugins, fsdp_plugin) if p is not None]
    return Arguments(code, handlers, backend_plugins, gradient_accumulation_plugin or GradientAccumulationPlugin(),
                     dataloader_config, parallelism_config)


def _dynamo_backend(backend: Any, plugin: Any) -> str | None:
    """The dynamo_backend setting an Accelerator(dynamo_backend=...) or TorchDynamoPlugin asks for (None: not given)."""
    value = getattr(plugin, "backend", None) if plugin is not None else backend
    if value is None:
        return None
    return str(getattr(value, "value", value)).lower()


def _dataloader_config_settings(config: DataLoaderConfiguration) -> dict[str, Any]:
    """The settings a DataLoaderConfiguration sets (its fields left at their defaults set nothing)."""
    return {
        "use_seedable_sampler": True if config.use_seedable_sampler else None,
        "data_seed": config.data_seed,
        "resume_data_position": True if config.use_stateful_dataloader else None,
    }


def _check_handlers(handlers: list) -> None:
    from acc.compat.recipes import AORecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
    from acc.contract.kwargs import KwargsHandler

    seen: set[type] = set()
    for handler in handlers:
        if not isinstance(handler, KwargsHandler):
            raise TypeError(f"kwargs_handlers: {handler!r} is not a kwargs handler (e.g. DistributedDataParallelKwargs,"
                            " GradScalerKwargs, InitProcessGroupKwargs, AutocastKwargs)")
        if isinstance(handler, (AORecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs)):
            raise AccError(f"kwargs_handlers: {type(handler).__name__} asks for fp8 training, which acc does not have "
                           "yet (it needs torchao, Transformer Engine or MS-AMP and a GPU with fp8: Hopper or Ada); "
                           "remove the handler and use mixed_precision='bf16'")
        if type(handler) in seen:
            raise ValueError(f"kwargs_handlers: only one {type(handler).__name__} may be given")
        seen.add(type(handler))


def _refuse_unsupported(**arguments: Any) -> None:
    """Arguments acc does not take yet: an error that names them (never silently ignored)."""
    given = [name for name, value in arguments.items() if value is not None]
    if given:
        raise AccError(f"Accelerator({', '.join(f'{n}=...' for n in given)}): not supported by acc yet; acc "
                       "configures backends through launch settings (acc launch --backend fsdp|deepspeed and their "
                       "flags, or acc.toml)")


_NOTED: set[str] = set()


def note_once(key: str, message: str, show: bool) -> None:
    """One line on one process, once per process (for differences a user should know about)."""
    if key in _NOTED:
        return
    _NOTED.add(key)
    if show:
        import sys

        print(f"acc: {message}", file=sys.stderr)
