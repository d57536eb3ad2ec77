"""The ddp backend's hooks. Launcher-side hooks are torch-free; torch is imported inside worker hooks."""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import acc
from acc import hardware
from acc.distributed_hooks import (  # noqa: F401  (the torch.distributed collectives, as this plugin's hooks)
    acc_all_gather, acc_all_reduce, acc_barrier, acc_broadcast, acc_broadcast_object, acc_gather_object,
)
from acc.launch import elastic_plan
from acc.settings import Setting

ACC_HOOKSPEC_VERSION = 1
ACC_REQUIRES = ("torch",)
NAME = "ddp"


@acc.hookimpl
def acc_add_settings(registry: Any) -> None:
    registry.add(Setting(
        "process_group_backend", str, "auto", "torch.distributed backend; auto: nccl on CUDA, gloo on CPU",
        ("--process-group-backend",), choices=("auto", "gloo", "nccl", "mpi"),
    ))


@acc.hookimpl
def acc_validate(settings: Any) -> list[str]:
    if settings["backend"] != NAME:
        return []
    problems = []
    cuda = hardware.visible_cuda_devices()
    if settings["process_group_backend"] == "nccl" and (cuda == 0 or settings["cpu"]):
        problems.append(
            "process_group_backend 'nccl' needs CUDA devices, but "
            + ("--cpu is set" if settings["cpu"] else "none is visible")
            + f" (from {settings.source('process_group_backend')}); use gloo or auto"
        )
    if cuda and not settings["cpu"] and settings["nproc"] > cuda:
        problems.append(
            f"nproc = {settings['nproc']} (from {settings.source('nproc')}) but only {cuda} CUDA device(s) are "
            f"visible; ddp runs one process per device: use --nproc {cuda}, or --cpu for CPU processes"
        )
    return problems


@acc.hookimpl
def acc_detect(settings: Any) -> Any:
    from acc.detection import Detection

    cuda = hardware.visible_cuda_devices()
    if cuda >= 2 and not settings["cpu"]:
        return Detection(NAME, 50, cuda, f"{cuda} CUDA devices found")
    if settings["nproc"] > 1 and not settings.is_default("nproc"):
        return Detection(NAME, 20, settings["nproc"], f"{settings['nproc']} processes asked for")
    return None


@acc.hookimpl
def acc_launch_plan(settings: Any) -> acc.LaunchPlan:
    cuda = hardware.visible_cuda_devices()
    device = "cpu (gloo)" if settings["cpu"] or cuda == 0 else f"cuda:<local rank> of {cuda} visible (nccl)"
    return elastic_plan(settings, device=device)


@acc.hookimpl
def acc_env_report(settings: Any) -> dict[str, str]:
    import torch.distributed as dist

    return {
        "torch.distributed": str(dist.is_available()),
        "gloo": str(dist.is_available() and dist.is_gloo_available()),
        "nccl": str(dist.is_available() and dist.is_nccl_available()),
    }


@acc.hookimpl
def acc_setup(ctx: acc.RunContext) -> acc.ProcessInfo:
    from acc import distributed

    return distributed.init_process_group(ctx, NAME, ctx.settings["process_group_backend"])


@acc.hookimpl
def acc_teardown(ctx: acc.RunContext) -> None:
    import gc

    from acc import distributed

    # A DDP module keeps its reducer, logger and process group alive; if they outlive the group they are
    # destroyed at interpreter exit, which aborted gloo in 4 of 24 stressed runs (0 of 30 once released).
    for model in list(ctx.backend_state.get("ddp_models", ())):
        for attr in ("reducer", "logger", "process_group"):
            model.__dict__.pop(attr, None)
    gc.collect()
    distributed.destroy_process_group(ctx.settings["timeout"])


@acc.hookimpl
def acc_wrap(ctx: acc.RunContext, models: list, optimizers: list) -> tuple[list, list]:
    from torch.nn.parallel import DistributedDataParallel

    from acc.kwargs import DistributedDataParallelKwargs

    handler = ctx.handler(DistributedDataParallelKwargs)
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


@acc.hookimpl
def acc_unwrap_model(ctx: acc.RunContext, model: Any) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


@acc.hookimpl
def acc_no_sync(ctx: acc.RunContext, model: Any) -> Any:
    no_sync = getattr(model, "no_sync", None)
    return no_sync() if callable(no_sync) else contextlib.nullcontext()
