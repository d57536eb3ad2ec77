"""The xla backend's hooks: PyTorch/XLA on the PJRT runtime (TPU chips, or the XLA CPU device for tests).

Launcher-side hooks (settings checks, the plan) are torch-free: they read the environment and the PCI bus
only. Worker-side hooks import torch_xla inside the function.

One training step is one XLA graph: the prepared data loader cuts the graph (`torch_xla.sync()`) each time
it fetches the next batch, and once more when the epoch ends, so every step traces the same graph, which
compiles once and then replays. Gradients are averaged across replicas in the optimizer step
(`xm.optimizer_step`), or already in `clip_grad_norm_` so that the clipped norm is the global one.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from pathlib import Path
from typing import Any, Iterator, Mapping

from acc import backend as sdk

from .loader import XlaDataLoader, _DeviceFeed

ACC_HOOKSPEC_VERSION = 2
ACC_REQUIRES = ("torch_xla",)
NAME = "xla"
INSTALL_HINT = "pip install acc-xla (pulls torch-xla 2.9 and the torch 2.9 it is built for; TPU VM: acc-xla[tpu])"

PCI_DEVICES = sdk.PCI_DEVICES
FP16_PROBLEM = ("mixed_precision 'fp16' is not supported by the xla backend: XLA devices (TPU) compute in "
                "bfloat16, which needs no loss scaling; use --mixed-precision bf16 (or 'no')")


# --------------------------------------------------------------------------- launcher side (torch-free)


def tpu_chips(root: Path | None = None) -> int:
    """How many TPU chips are attached to this host (the kernel's torch-free PCI reading)."""
    return sdk.tpu_devices(pci_root=root)


def libtpu_available(environ: Mapping[str, str]) -> bool:
    """Whether torch_xla would find libtpu (TPU_LIBRARY_PATH, the libtpu package, or a bundled copy)."""
    if environ.get("TPU_LIBRARY_PATH") or sdk.module_available("libtpu"):
        return True
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch_xla")
    except (ImportError, ValueError):
        return False
    return bool(spec and spec.origin and (Path(spec.origin).parent / "lib" / "libtpu.so").is_file())


def pjrt_device(settings: Mapping[str, Any], environ: Mapping[str, str] | None = None,
                chips: int | None = None) -> tuple[str, str]:
    """(PJRT device type, why) for this launch: --cpu, else PJRT_DEVICE, else TPU when one is attached and
    libtpu is installed, else CPU (the same choice torch_xla makes when PJRT_DEVICE is unset)."""
    environ = os.environ if environ is None else environ
    if settings["cpu"]:
        return "CPU", "--cpu"
    if environ.get("PJRT_DEVICE"):
        return environ["PJRT_DEVICE"].upper(), "the environment's PJRT_DEVICE"
    chips = tpu_chips() if chips is None else chips
    if chips and libtpu_available(environ):
        return "TPU", f"auto: {chips} TPU chip(s) attached"
    return "CPU", "auto: no TPU attached" if not chips else "auto: TPU attached but libtpu is not installed"


def local_devices(kind: str, environ: Mapping[str, str] | None = None, chips: int | None = None) -> int | None:
    """How many processes PJRT starts on this host for `kind` (None: PJRT decides, unknown here)."""
    environ = os.environ if environ is None else environ
    if kind == "CPU":
        return 1
    if kind == "TPU":
        return tpu_chips() if chips is None else chips
    if kind in ("CUDA", "GPU"):
        return sdk.visible_cuda_devices(environ)
    return None


def _distribution_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@sdk.hookimpl
def acc_validate(settings: Any) -> list[str]:
    if settings["backend"] != NAME:
        return []
    problems = []
    torch_version = _distribution_version("torch")
    if not sdk.module_available("torch_xla") and torch_version and not torch_version.startswith("2.9"):
        # the kernel already says torch_xla is missing; installing it here would also replace torch
        problems.append(
            f"torch-xla 2.9 needs torch 2.9, but this environment has torch {torch_version}, which "
            "`pip install acc-xla` would replace: give the xla backend an environment of its own, e.g. "
            "python -m venv .venv-xla && .venv-xla/bin/pip install acc-xla"
        )
    kind, why = pjrt_device(settings)
    if settings["num_machines"] > 1:
        problems.append(
            f"num_machines = {settings['num_machines']} (from {settings.source('num_machines')}): the xla backend "
            "does not take machine settings; PJRT finds the hosts of a TPU slice itself. Run the same "
            "`acc launch --backend xla ...` on every host (e.g. gcloud compute tpus tpu-vm ssh NAME --worker=all "
            "--command=...) and leave --num-machines/--machine-rank out"
        )
    if settings["max_restarts"]:
        problems.append(
            f"max_restarts = {settings['max_restarts']} (from {settings.source('max_restarts')}): the xla backend's "
            "PJRT launcher does not restart workers; leave --max-restarts out (rerun the launch, and resume with "
            "load_state)"
        )
    cpu_devices = os.environ.get("CPU_NUM_DEVICES", "1")
    if kind == "CPU" and cpu_devices.strip() not in ("", "1"):
        problems.append(
            f"CPU_NUM_DEVICES={cpu_devices} asks for several XLA CPU devices in one process, which fails in "
            "XLA's own collective rendezvous (torch-xla 2.9); unset it: the XLA CPU device is for testing, "
            "multi-replica runs are for TPU"
        )
    local = local_devices(kind)
    if kind == "TPU" and local == 0:
        problems.append(f"PJRT_DEVICE=TPU ({why}) but no TPU chip is attached to this host; "
                        "use PJRT_DEVICE=CPU or --cpu to test on the XLA CPU device")
    nproc = settings["nproc"]
    if not settings.is_default("nproc") and nproc != 1 and nproc != local:
        valid = "1 (one device) or leave --nproc out" + (f", or {local} (every local device)" if local and local > 1
                                                           else "")
        problems.append(
            f"nproc = {nproc} (from {settings.source('nproc')}): PJRT starts one process per local XLA device "
            f"({local if local is not None else 'decided by PJRT'} on PJRT_DEVICE={kind}) or a single one; "
            f"use {valid}"
        )
    return problems


@sdk.hookimpl
def acc_detect(settings: Any) -> Any:

    chips = tpu_chips()
    return sdk.Detection(NAME, 60, chips, f"{chips} TPU chips found") if chips else None


@sdk.hookimpl
def acc_launch_plan(settings: Any) -> sdk.LaunchPlan:
    kind, why = pjrt_device(settings)
    local = local_devices(kind) or 1
    nproc = 1 if (not settings.is_default("nproc") and settings["nproc"] == 1) else local
    if kind == "CPU":
        device = f"xla:0, the XLA CPU device (PJRT_DEVICE=CPU, {why})"
    else:
        device = f"xla:0 in each process, {nproc} {kind} device process(es) on this host (PJRT_DEVICE={kind}, {why})"
    notes = ["PJRT (xmp.spawn) starts the processes; every process prints to this console"]
    if kind == "CPU":
        notes.append("the XLA CPU device is for testing; multi-replica training needs TPU devices")
    return sdk.LaunchPlan(engine="pjrt", nproc_per_machine=nproc, device=device, env={"PJRT_DEVICE": kind},
                          notes=notes)


@sdk.hookimpl
def acc_env_report(settings: Any) -> dict[str, str]:
    kind, why = pjrt_device(settings)
    report = {"PJRT device (planned)": f"{kind} ({why})", "TPU chips (PCI)": str(tpu_chips())}
    if not sdk.module_available("torch_xla"):
        report["torch_xla"] = f"not installed; {INSTALL_HINT}"
        return report
    os.environ.setdefault("PJRT_DEVICE", kind)  # acc env is its own process: pick what a launch would
    import torch_xla
    import torch_xla.runtime as xr

    report["torch_xla"] = torch_xla.__version__
    report["PJRT device type"] = str(xr.device_type())
    report["xla devices"] = ", ".join(torch_xla.real_devices())
    return report


# --------------------------------------------------------------------------- worker side: setup


def _world(ctx: sdk.RunContext) -> int:
    return ctx.num_processes


@sdk.hookimpl
def acc_setup(ctx: sdk.RunContext) -> sdk.ProcessInfo:
    if ctx.settings["mixed_precision"] == "fp16":
        raise sdk.AccError(FP16_PROBLEM)
    if ctx.settings["cpu"]:
        os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch
    import torch_xla
    import torch_xla.runtime as xr

    # An XLA tensor cannot take a CPU tensor's place (`param.data = ...`), so `model.to(xla)` would make new
    # Parameter objects and leave the user's optimizer holding the old CPU ones. Swapping keeps each
    # Parameter object (now holding XLA data), as moving to CUDA does; restored at teardown.
    ctx.backend_state["swap_was"] = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    device = torch_xla.device()
    world = xr.world_size()
    kind = str(xr.device_type() or "xla")
    ctx.backend_state["device_type"] = kind
    if world > 1:
        index, local, local_count = xr.global_ordinal(), xr.local_ordinal(), xr.local_device_count()
    else:
        index, local, local_count = 0, 0, 1
    return sdk.ProcessInfo(device=device, num_processes=world, process_index=index, local_process_index=local,
                           local_num_processes=local_count, distributed_type=f"xla_{kind.lower()}")


@sdk.hookimpl
def acc_teardown(ctx: sdk.RunContext) -> None:
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch_xla.sync()  # run what is still pending (e.g. the last step), then wait for the device
    xm.wait_device_ops()
    if _world(ctx) > 1:
        xm.rendezvous("acc.teardown")
    if "swap_was" in ctx.backend_state:
        torch.__future__.set_swap_module_params_on_conversion(ctx.backend_state.pop("swap_was"))


# --------------------------------------------------------------------------- worker side: wrap


@sdk.hookimpl
def acc_wrap(ctx: sdk.RunContext, models: list, optimizers: list) -> tuple[list, list]:
    import torch_xla.core.xla_model as xm

    for i, optimizer in enumerate(optimizers):
        stray = {str(p.device) for g in optimizer.param_groups for p in g["params"] if p.device.type != "xla"}
        if stray:
            raise sdk.AccError(
                f"optimizer #{i} ({type(optimizer).__name__}) holds parameters on {', '.join(sorted(stray))}, not "
                "on the XLA device, so its steps would not reach the model; build the optimizer from the "
                "model's parameters and prepare both (accelerator.prepare(model, optimizer)) without moving "
                "the model yourself in between"
            )
    if _world(ctx) > 1:
        for model in models:  # every replica starts from the master's weights, as DDP does
            xm.broadcast_master_param(model)
    ctx.backend_state.setdefault("optimizers", []).extend(optimizers)
    return list(models), list(optimizers)


@sdk.hookimpl
def acc_wrap_dataloader(ctx: sdk.RunContext, loader: Any) -> Any:
    if loader.device is not None:  # device placement wanted: batches go up through the parallel loader
        loader.feed_through(lambda source: _DeviceFeed(source, ctx.device))
    return XlaDataLoader(loader)


# --------------------------------------------------------------------------- worker side: step


def _prepared_optimizers(ctx: sdk.RunContext) -> list:
    return ctx.backend_state.get("optimizers", [])


@sdk.hookimpl
def acc_optimizer_step(ctx: sdk.RunContext, optimizer: Any) -> bool:
    import torch_xla.core.xla_model as xm

    synced = ctx.backend_state.setdefault("reduced", set())
    if id(optimizer) in synced:  # clip_grad_norm_ already averaged these gradients
        synced.discard(id(optimizer))
        optimizer.step()
    else:
        xm.optimizer_step(optimizer)  # average the gradients across replicas, then step (no graph cut)
    return True


@sdk.hookimpl
def acc_clip_grad_norm(ctx: sdk.RunContext, parameters: list, max_norm: float, norm_type: float) -> Any:
    import torch
    import torch_xla.core.xla_model as xm

    if _world(ctx) > 1:  # clip the global gradient: average first, and let the step not average again
        wanted = {id(p) for p in parameters}
        synced = ctx.backend_state.setdefault("reduced", set())
        for optimizer in _prepared_optimizers(ctx):
            if id(optimizer) not in synced and any(id(p) in wanted for g in optimizer.param_groups
                                                   for p in g["params"]):
                xm.reduce_gradients(optimizer)
                synced.add(id(optimizer))
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


# --------------------------------------------------------------------------- worker side: reduce


@contextlib.contextmanager
def _on_device(ctx: sdk.RunContext, tensor: Any) -> Iterator[list]:
    """XLA collectives run on XLA tensors: a CPU tensor goes up and its result comes back to the CPU."""
    box = [tensor.to(ctx.device) if tensor.device != ctx.device else tensor]
    yield box
    if tensor.device != ctx.device:
        box[0] = box[0].to(tensor.device)


_REDUCE = {"sum": "sum", "mean": "sum", "max": "max", "min": "min"}


def _exchange(tag: str, payload: bytes) -> list[bytes]:
    import torch_xla.core.xla_model as xm

    return xm.rendezvous(tag, payload)


class XlaCommunicator(sdk.Communicator):
    """The collectives over torch_xla (xm.all_reduce, all_gather, collective_broadcast, rendezvous)."""

    def __init__(self, ctx: sdk.RunContext):
        self.ctx = ctx

    def all_reduce(self, tensor: Any, op: str) -> Any:
        import torch
        import torch_xla.core.xla_model as xm

        if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
            tensor = tensor.to(torch.float32)
        with _on_device(self.ctx, tensor) as box:
            scale = 1.0 / _world(self.ctx) if op == "mean" else 1.0
            box[0] = xm.all_reduce(_REDUCE[op], box[0], scale=scale)
        return box[0]

    def all_gather(self, tensor: Any) -> Any:
        import torch
        import torch_xla.core.xla_model as xm

        if tensor.dtype == torch.bool:
            return self.all_gather(tensor.to(torch.uint8)).to(torch.bool)
        with _on_device(self.ctx, tensor) as box:
            box[0] = xm.all_gather(box[0].contiguous(), dim=0)
        return box[0]

    def gather_object(self, obj: Any) -> list:
        if _world(self.ctx) == 1:
            return [obj]
        return [pickle.loads(part) for part in _exchange("acc.gather_object", pickle.dumps(obj))]

    def broadcast(self, tensor: Any, src: int) -> Any:
        import torch
        import torch_xla.core.xla_model as xm

        if _world(self.ctx) == 1:
            return tensor
        if tensor.dtype == torch.bool:
            return self.broadcast(tensor.to(torch.uint8), src).to(torch.bool)
        with _on_device(self.ctx, tensor) as box:
            box[0] = box[0].clone()
            xm.collective_broadcast([box[0]], root_ordinal=src)
        return box[0]

    def broadcast_object(self, obj: Any, src: int) -> Any:
        if _world(self.ctx) == 1:
            return obj
        mine = pickle.dumps(obj) if self.ctx.process_index == src else b""
        return pickle.loads(_exchange("acc.broadcast_object", mine)[src])

    def barrier(self) -> None:
        import torch_xla.core.xla_model as xm

        xm.rendezvous("acc.barrier")  # syncs pending graphs first, on every replica alike


@sdk.hookimpl
def acc_communicator(ctx: sdk.RunContext) -> XlaCommunicator:
    return XlaCommunicator(ctx)


@sdk.hookimpl
def acc_capabilities(settings: Any) -> sdk.Capabilities:
    return sdk.Capabilities(sync="every_step", state="replicated", reshard=True,
                            distributed_type=sdk.DistributedType.XLA, mixed_precision=("no", "bf16"),
                            notes=("XLA devices (TPU) compute in bfloat16, which needs no loss scaling; use "
                                   "--mixed-precision bf16 (or 'no')",))


# --------------------------------------------------------------------------- worker side: save and load

def _flush() -> None:
    """Run what is pending and wait for it, on every replica alike (a graph holding collectives must run on
    all of them, so no process may cut the graph alone)."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch_xla.sync()
    xm.wait_device_ops()


def _to_cpu(data: Any) -> Any:
    """`data` with every tensor copied to the CPU (after `_flush`, a plain transfer)."""
    import torch

    return sdk.apply(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, data)


@sdk.hookimpl
def acc_save_checkpoint(ctx: sdk.RunContext, directory: Any, models: list, optimizers: list) -> list[str]:

    _flush()
    if ctx.process_index != 0:  # every replica holds the same weights: the master ordinal writes them
        return []
    written = []
    for i, model in enumerate(models):
        sdk.save_tensors(_to_cpu(model.state_dict()), directory / f"model_{i}.safetensors")
        written.append(f"model_{i}.safetensors")
    for i, optimizer in enumerate(optimizers):
        sdk.save_object(_to_cpu(optimizer.state_dict()), directory / f"optimizer_{i}.pt")
        written.append(f"optimizer_{i}.pt")
    return written


@sdk.hookimpl
def acc_load_checkpoint(ctx: sdk.RunContext, directory: Any, models: list, optimizers: list, manifest: dict) -> bool:

    for i, model in enumerate(models):
        path = sdk.verify(directory, manifest, f"model_{i}.safetensors")
        state = sdk.load_tensors(path, device="cpu")
        try:
            model.load_state_dict(state, strict=True)  # copies into the parameters, on the XLA device
        except RuntimeError as exc:
            raise sdk.CheckpointError(f"{path}: does not fit model #{i} ({type(model).__name__}): "
                                       f"{' '.join(str(exc).split())[:400]}") from None
    for i, optimizer in enumerate(optimizers):
        path = sdk.verify(directory, manifest, f"optimizer_{i}.pt")
        try:  # the optimizer moves each state tensor to its parameter's device (the XLA device)
            optimizer.load_state_dict(sdk.load_object(path, map_location="cpu"))
        except (ValueError, KeyError) as exc:
            raise sdk.CheckpointError(f"{path}: does not fit optimizer #{i} ({type(optimizer).__name__}): "
                                       f"{exc}") from None
    return True


@sdk.hookimpl
def acc_model_state_dict(ctx: sdk.RunContext, model: Any) -> dict:
    _flush()
    return _to_cpu(model.state_dict())


__all__ = ["XlaDataLoader", "local_devices", "pjrt_device", "tpu_chips"]
