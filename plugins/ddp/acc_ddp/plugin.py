"""The ddp backend's hooks. Launcher-side hooks are torch-free; torch is imported inside worker hooks."""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from acc import backend as sdk

ACC_HOOKSPEC_VERSION = 2
ACC_REQUIRES = ("torch",)
NAME = "ddp"


@sdk.hookimpl
def acc_add_settings(registry: Any) -> None:
    registry.add(sdk.Setting(
        "process_group_backend", str, "auto", "torch.distributed backend; auto: nccl on CUDA, gloo on CPU",
        ("--process-group-backend",), choices=("auto", "gloo", "nccl", "mpi"),
    ))


@sdk.hookimpl
def acc_validate(settings: Any) -> list[str]:
    if settings["backend"] != NAME:
        return []
    return sdk.device_problems(settings, NAME)


@sdk.hookimpl
def acc_capabilities(settings: Any) -> sdk.Capabilities:
    cuda = sdk.visible_cuda_devices() and not settings["cpu"]
    return sdk.Capabilities(sync="every_step", state="replicated", reshard=True, mesh_dims=("dp_replicate",),
                            distributed_type=sdk.DistributedType.MULTI_GPU if cuda else sdk.DistributedType.MULTI_CPU)


@sdk.hookimpl
def acc_communicator(ctx: Any) -> Any:
    return sdk.TorchDistributed()


@sdk.hookimpl
def acc_detect(settings: Any) -> Any:

    cuda = sdk.visible_cuda_devices()
    if cuda >= 2 and not settings["cpu"]:
        return sdk.Detection(NAME, 50, cuda, f"{cuda} CUDA devices found")
    if settings["nproc"] > 1 and not settings.is_default("nproc"):
        return sdk.Detection(NAME, 20, settings["nproc"], f"{settings['nproc']} processes asked for")
    if settings["num_machines"] > 1:  # e.g. from a scheduler (srun across nodes)
        return sdk.Detection(NAME, 20, settings["nproc"], f"{settings['num_machines']} machines (from "
                             f"{settings.source('num_machines')})")
    return None


@sdk.hookimpl
def acc_launch_plan(settings: Any) -> sdk.LaunchPlan:
    cuda = sdk.visible_cuda_devices()
    device = "cpu (gloo)" if settings["cpu"] or cuda == 0 else f"cuda:<local rank> of {cuda} visible (nccl)"
    return sdk.elastic_plan(settings, device=device)


@sdk.hookimpl
def acc_env_report(settings: Any) -> dict[str, str]:
    import torch.distributed as dist

    return {
        "torch.distributed": str(dist.is_available()),
        "gloo": str(dist.is_available() and dist.is_gloo_available()),
        "nccl": str(dist.is_available() and dist.is_nccl_available()),
    }


@sdk.hookimpl
def acc_setup(ctx: sdk.RunContext) -> sdk.ProcessInfo:
    return sdk.init_process_group(ctx, NAME, ctx.settings["process_group_backend"])


@sdk.hookimpl
def acc_teardown(ctx: sdk.RunContext) -> None:
    import gc

    # A DDP module keeps its reducer, logger and process group alive; if they outlive the group they are
    # destroyed at interpreter exit, which aborted gloo in 4 of 24 stressed runs (0 of 30 once released).
    for model in list(ctx.backend_state.get("ddp_models", ())):
        for attr in ("reducer", "logger", "process_group"):
            model.__dict__.pop(attr, None)
    gc.collect()
    sdk.destroy_process_group(ctx.settings["timeout"])


@sdk.hookimpl
def acc_wrap(ctx: sdk.RunContext, models: list, optimizers: list) -> tuple[list, list]:
    from torch.nn.parallel import DistributedDataParallel

    handler = ctx.handler(sdk.DistributedDataParallelKwargs)
    kwargs = handler.to_kwargs() if handler else {}
    wrapped = []
    for model in models:
        if isinstance(model, DistributedDataParallel) or not any(p.requires_grad for p in model.parameters()):
            wrapped.append(model)  # already wrapped, or frozen (nothing to synchronise)
            continue
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, **kwargs)
        if handler:
            handler.register_comm_hook(ddp)  # DistributedDataParallelKwargs(comm_hook=...), if one was chosen
        ctx.backend_state.setdefault("ddp_models", weakref.WeakSet()).add(ddp)
        wrapped.append(ddp)
    return wrapped, list(optimizers)


@sdk.hookimpl
def acc_unwrap_model(ctx: sdk.RunContext, model: Any) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


@sdk.hookimpl
def acc_no_sync(ctx: sdk.RunContext, model: Any) -> Any:
    no_sync = getattr(model, "no_sync", None)
    return no_sync() if callable(no_sync) else contextlib.nullcontext()
