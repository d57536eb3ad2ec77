"""The mps backend's hooks: one process on the GPU of an Apple Silicon Mac (torch device "mps").

Launcher-side hooks are torch-free (platform facts only); torch is imported inside worker-side hooks.
Every hook not implemented here is the builtin cpu backend's, which is right for one MPS process:
no-op collectives, plain backward and step, `torch.amp.GradScaler("mps")` for fp16, and checkpoint
loading with `map_location` = this process's device.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from acc import backend as sdk

from . import availability, precision
from .availability import FALLBACK_ENV

ACC_HOOKSPEC_VERSION = 2
ACC_REQUIRES = ("torch",)
NAME = "mps"


# --------------------------------------------------------------------------- launcher side (torch-free)


@sdk.hookimpl
def acc_add_settings(registry: Any) -> None:
    registry.add(sdk.Setting(
        "mps_fallback", bool, False,
        f"run operators MPS lacks on the CPU, with a warning from torch (sets {FALLBACK_ENV}=1 for the worker)",
        ("--mps-fallback",),
    ))


@sdk.hookimpl
def acc_capabilities(settings: Any) -> sdk.Capabilities:
    return sdk.Capabilities(sync="none", distributed_type=sdk.DistributedType.NO)


@sdk.hookimpl
def acc_validate(settings: Any) -> list[str]:
    if settings["backend"] != NAME:
        return []
    problems = []
    if settings["nproc"] > 1:
        problems.append(
            f"backend 'mps' runs one process (a Mac has one GPU, and torch.distributed has no MPS transport), "
            f"but nproc = {settings['nproc']} (from {settings.source('nproc')}); drop --nproc (or set it to 1)"
        )
    if settings["num_machines"] > 1:
        problems.append(
            f"backend 'mps' runs on one machine, but num_machines = {settings['num_machines']} (from "
            f"{settings.source('num_machines')}); drop --num-machines: training across Macs is not supported"
        )
    if settings["cpu"]:
        return problems
    status = availability.mps_status(with_torch=False)
    if not status.available:
        problems.append(
            f"backend 'mps' (from {settings.source('backend')}) needs the GPU of an Apple Silicon Mac, which is "
            f"not available: {status.reason}; {availability.use_instead()}"
        )
    elif settings["mixed_precision"] == "bf16" and availability.lacks_bf16(status.macos):
        problems.append(
            f"mixed_precision 'bf16' (from {settings.source('mixed_precision')}) on MPS needs macOS "
            f"{availability.dotted(availability.BF16_MIN_MACOS)} or newer, but this Mac runs macOS "
            f"{availability.dotted(status.macos)}; use --mixed-precision fp16 or no, or update macOS"
        )
    return problems


@sdk.hookimpl
def acc_detect(settings: Any) -> Any:

    status = availability.mps_status(with_torch=False)
    return sdk.Detection(NAME, 40, 1, "an Apple Silicon GPU (MPS) found") if status.available else None


def fallback_env(settings: Any) -> dict[str, str]:
    """PYTORCH_ENABLE_MPS_FALLBACK for the worker: 1 when on, 0 when set off explicitly, else inherited."""
    if settings.get("mps_fallback"):
        return {FALLBACK_ENV: "1"}
    if "mps_fallback" in settings and not settings.is_default("mps_fallback"):
        return {FALLBACK_ENV: "0"}
    return {}


@sdk.hookimpl
def acc_launch_plan(settings: Any) -> sdk.LaunchPlan:
    env = fallback_env(settings)
    notes = []
    if env.get(FALLBACK_ENV) == "1":
        notes.append(f"{FALLBACK_ENV}=1: operators MPS lacks run on the CPU (torch warns when it falls back)")
    device = "cpu (--cpu: the MPS device is not used)" if settings["cpu"] else "mps (the Apple Silicon GPU)"
    return sdk.LaunchPlan(engine="process", device=device, env=env, notes=notes)


@sdk.hookimpl
def acc_env_report(settings: Any) -> dict[str, str]:
    status = availability.mps_status()
    report = {"MPS available": "yes" if status.available else f"no: {status.reason}", **status.facts}
    report[FALLBACK_ENV] = os.environ.get(FALLBACK_ENV, "(unset)")
    if status.available:
        import torch

        get_name = getattr(torch.backends.mps, "get_name", None)
        if get_name is not None:
            report["MPS device"] = str(get_name())
    return report


# --------------------------------------------------------------------------- worker side


def _warn_if_fallback_unset(settings: Any) -> None:
    if settings.get("mps_fallback") and os.environ.get(FALLBACK_ENV) != "1":
        warnings.warn(
            f"mps_fallback is on (from {settings.source('mps_fallback')}), but {FALLBACK_ENV} was not 1 when torch "
            "started, and torch reads it only then: operators MPS lacks will raise instead of running on the CPU. "
            f"Start the script with `acc launch` (it sets the variable), or export {FALLBACK_ENV}=1 first",
            stacklevel=2,
        )


@sdk.hookimpl
def acc_setup(ctx: sdk.RunContext) -> sdk.ProcessInfo:
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        raise sdk.AccError(
            f"this process is one of {world} started by a distributed launcher (WORLD_SIZE={world}), but backend "
            "'mps' runs one process on the Mac's one GPU; run it alone: acc launch --backend mps script.py"
        )
    if ctx.settings["cpu"]:
        return sdk.ProcessInfo(device=torch.device("cpu"))
    status = availability.mps_status()
    if not status.available:
        f = status.facts
        raise sdk.AccError(
            f"backend 'mps' cannot run: the MPS device is not available: {status.reason} [torch "
            f"{f.get('torch')}: torch.backends.mps.is_built() = {f.get('mps.is_built()')}, is_available() = "
            f"{f.get('mps.is_available()')}; {f.get('platform')}, macOS {f.get('macOS')}]; {availability.use_instead()}"
        )
    _warn_if_fallback_unset(ctx.settings)
    device = torch.device("mps")
    precision.check(ctx.settings["mixed_precision"], device, status)
    return sdk.ProcessInfo(device=device)
