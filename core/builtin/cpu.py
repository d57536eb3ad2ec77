"""The embedded default backend: one process, on the CPU or on the one visible CUDA device.

Every hook here is `trylast`: it is the answer when no other plugin answers. Torch is imported inside
the worker-side hooks only.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from acc.assembly import hardware
from acc.contract.capabilities import Capabilities
from acc.contract.context import ProcessInfo, RunContext
from acc.contract.hookspecs import HOOKSPEC_VERSION, hookimpl
from acc.contract.launch_plan import LaunchPlan
from acc.contract.settings import ResolvedSettings
from acc.errors import AccError

ACC_HOOKSPEC_VERSION = HOOKSPEC_VERSION
ACC_REQUIRES = ("torch",)


def _multi_process_hint() -> str:
    from acc.assembly.plugins import installed_backends

    if "ddp" in installed_backends():
        return "use a multi-process backend, e.g. --backend ddp (installed)"
    return "use a multi-process backend, e.g. ddp: pip install acc-ddp, then --backend ddp"


@hookimpl(trylast=True)
def acc_validate(settings: ResolvedSettings) -> list[str]:
    problems = []
    if settings["backend"] != "cpu":
        return problems
    if settings["nproc"] > 1:
        problems.append(
            f"backend 'cpu' runs a single process, but nproc = {settings['nproc']} "
            f"(from {settings.source('nproc')}); {_multi_process_hint()}, or drop --nproc"
        )
    if settings.get("num_machines", 1) > 1:
        problems.append(
            f"backend 'cpu' runs on one machine, but num_machines = {settings['num_machines']} "
            f"(from {settings.source('num_machines')}); {_multi_process_hint()}"
        )
    return problems


def device_description(settings: ResolvedSettings) -> str:
    cuda = hardware.visible_cuda_devices()
    if settings["cpu"] or cuda == 0:
        return "cpu"
    return "cuda:0" + (f" (1 of {cuda} visible CUDA devices; the others stay idle)" if cuda > 1 else "")


@hookimpl(trylast=True)
def acc_detect(settings: ResolvedSettings) -> Any:
    from acc.contract.detection import Detection

    cuda = hardware.visible_cuda_devices()
    reason = "one CUDA device found" if cuda == 1 else "no accelerator that another installed backend uses"
    return Detection("cpu", 1, 1, reason)


@hookimpl(trylast=True)
def acc_capabilities(settings: ResolvedSettings) -> Capabilities:
    return Capabilities(sync="none", distributed_type="NO")


@hookimpl(trylast=True)
def acc_launch_plan(settings: ResolvedSettings) -> LaunchPlan:
    return LaunchPlan(engine="process", device=device_description(settings))


@hookimpl(trylast=True)
def acc_env_report(settings: ResolvedSettings) -> dict[str, str]:
    import torch

    report = {"torch": torch.__version__, "cpu threads": str(torch.get_num_threads())}
    report["cuda available"] = str(torch.cuda.is_available())
    if torch.cuda.is_available():
        report["cuda devices"] = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        report["cuda version"] = str(torch.version.cuda)
    return report


@hookimpl(trylast=True)
def acc_setup(ctx: RunContext) -> ProcessInfo:
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and ctx.settings["backend"] == "cpu":
        raise AccError(
            f"this process is one of {world} started by a distributed launcher (WORLD_SIZE={world}), but the "
            "backend is 'cpu', which runs one process: each would train alone on all the data. Select a "
            "multi-process backend, e.g. ACC_BACKEND=ddp, or run: acc launch --backend ddp --nproc "
            f"{os.environ.get('LOCAL_WORLD_SIZE', world)} script.py"
        )
    chosen = os.environ.get("ACCELERATE_TORCH_DEVICE")  # Accelerate's variable naming the process's device
    if chosen:
        device = torch.device(chosen)
        module = getattr(torch, device.type, None)
        if device.index is not None and hasattr(module, "set_device"):
            module.set_device(device)
    elif not ctx.settings["cpu"] and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return ProcessInfo(device=device)


@hookimpl(trylast=True)
def acc_wrap(ctx: RunContext, models: list, optimizers: list) -> tuple[list, list]:
    return list(models), list(optimizers)


@hookimpl(trylast=True)
def acc_wrap_dataloader(ctx: RunContext, loader: Any) -> Any:
    return loader


@hookimpl(trylast=True)
def acc_unwrap_model(ctx: RunContext, model: Any) -> Any:
    return model


@hookimpl(trylast=True)
def acc_no_sync(ctx: RunContext, model: Any) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


@hookimpl(trylast=True)
def acc_backward(ctx: RunContext, loss: Any, kwargs: dict) -> None:
    loss.backward(**kwargs)


@hookimpl(trylast=True)
def acc_optimizer_step(ctx: RunContext, optimizer: Any) -> bool:
    optimizer.step()
    return True


@hookimpl(trylast=True)
def acc_clip_grad_norm(ctx: RunContext, parameters: list, max_norm: float, norm_type: float) -> Any:
    import torch

    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


@hookimpl(trylast=True)
def acc_grad_scaler(ctx: RunContext, kwargs: dict) -> Any:
    import torch

    return torch.amp.GradScaler(ctx.device.type, **kwargs)


@hookimpl(trylast=True)
def acc_communicator(ctx: RunContext) -> Any:
    from acc.contract.communicator import LocalCommunicator

    return LocalCommunicator()


@hookimpl(trylast=True)
def acc_save_checkpoint(ctx: RunContext, directory: Any, models: list, optimizers: list) -> list[str]:
    from acc.checkpointing import files as ckpt
    from acc.checkpointing.hashed_io import run_concurrently

    if ctx.process_index != 0:  # every process holds the same replica: the main process writes it
        return []
    jobs, written = [], []
    for i, model in enumerate(models):
        state, path = model.state_dict(), directory / f"model_{i}.safetensors"
        jobs.append(lambda state=state, path=path: ckpt.save_tensors(state, path))
        written.append(path.name)
    for i, optimizer in enumerate(optimizers):
        state, path = optimizer.state_dict(), directory / f"optimizer_{i}.pt"
        jobs.append(lambda state=state, path=path: ckpt.save_object(state, path))
        written.append(path.name)
    run_concurrently(jobs)  # the files are written at the same time (each hashed while written)
    return written


@hookimpl(trylast=True)
def acc_load_checkpoint(ctx: RunContext, directory: Any, models: list, optimizers: list, manifest: dict) -> None:
    from acc.checkpointing import files as ckpt

    for i, model in enumerate(models):
        path = ckpt.verify(directory, manifest, f"model_{i}.safetensors")
        state = ckpt.load_tensors(path, device=ctx.device)
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise ckpt.CheckpointError(f"{path}: does not fit model #{i} ({type(model).__name__}): "
                                       f"{str(exc).splitlines()[0]} {' '.join(str(exc).split())[:400]}") from None
    for i, optimizer in enumerate(optimizers):
        path = ckpt.verify(directory, manifest, f"optimizer_{i}.pt")
        try:
            optimizer.load_state_dict(ckpt.load_object(path, map_location=ctx.device))
        except (ValueError, KeyError) as exc:
            raise ckpt.CheckpointError(f"{path}: does not fit optimizer #{i} ({type(optimizer).__name__}): "
                                       f"{exc}") from None


@hookimpl(trylast=True)
def acc_model_state_dict(ctx: RunContext, model: Any) -> dict:
    from acc.big_model.offloaded import get_state_dict_offloaded_model, has_offloaded_params

    if any(has_offloaded_params(m) for m in model.modules()):  # dispatched with offload: weights read back
        return get_state_dict_offloaded_model(model)
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


@hookimpl(trylast=True)
def acc_merge_weights(directory: Any, manifest: dict, index: int, out: Any) -> list[str]:
    from safetensors import safe_open

    from acc.checkpointing.files import save_tensors, verify
    from acc.checkpointing.pieces import META_KEY, ShardedReader, model_prefix
    from acc.errors import CheckpointError

    pieces = []
    for name in sorted(manifest["files"]):
        if name.endswith(".safetensors"):
            path = verify(directory, manifest, name)
            with safe_open(str(path), framework="pt") as handle:
                if META_KEY in (handle.metadata() or {}):
                    pieces.append(path)
    if not pieces:
        whole = f"model_{index}.safetensors"
        hint = f"; its weights are already one file: {directory / whole}" if whole in manifest["files"] else ""
        raise CheckpointError(f"{directory} is not a sharded checkpoint (no piece files){hint}")
    reader = ShardedReader(pieces)
    prefix = model_prefix(index)
    names = [n for n in reader.names() if n.startswith(prefix)]
    if not names:
        held = sorted({n.split(".")[1] for n in reader.names() if n.startswith("model.")})
        raise CheckpointError(f"{directory}: no model #{index} in its piece files (models held: "
                              f"{', '.join(held) or 'none'}); choose one with --model")
    save_tensors({n[len(prefix):]: reader.full(n) for n in names}, out)
    return names


@hookimpl(trylast=True)
def acc_init_module(ctx: RunContext, empty_init: bool | None) -> None:
    return None  # a normal build: one process holds the whole model, as it trains it
