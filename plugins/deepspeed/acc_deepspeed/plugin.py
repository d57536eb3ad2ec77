"""The deepspeed backend's hooks: a DeepSpeed engine built from the user's model and optimizer at prepare.

Launcher-side hooks are torch-free; deepspeed is imported inside worker hooks only.
"""

from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path
from typing import Any

from acc import backend as sdk

from . import collectives as zero_collectives
from . import config as ds_config
from . import master, muon_import

ACC_HOOKSPEC_VERSION = 2
ACC_REQUIRES = ("torch", "deepspeed")
NAME = "deepspeed"
SUBDIR = "deepspeed"
TAG = "state"


@sdk.hookimpl
def acc_add_settings(registry: Any) -> None:
    registry.add(sdk.Setting("deepspeed_config", str, None, "a DeepSpeed JSON config file (or the JSON object itself, "
                         "starting with '{'); values left \"auto\" come from acc", ("--deepspeed-config",)))
    registry.add(sdk.Setting("zero_stage", int, None, "ZeRO stage (default: the config's, else 2)", ("--zero-stage",),
                         minimum=0, maximum=3))
    registry.add(sdk.Setting("offload_optimizer", str, "none", "where ZeRO keeps optimizer states",
                         ("--offload-optimizer",), choices=("none", "cpu")))
    registry.add(sdk.Setting("offload_params", str, "none", "where ZeRO-3 keeps parameters", ("--offload-params",),
                         choices=("none", "cpu")))
    registry.add(sdk.Setting("gradient_clipping", float, None, "clip gradients to this total norm inside the engine's step",
                         ("--gradient-clipping",), minimum=0))
    registry.add(sdk.Setting(
        "zero_buckets", str, "auto",
        "ZeRO bucket sizes the DeepSpeed config leaves out (values the config gives always win): auto (model where "
        "the model's hidden size is known, else deepspeed; on the bench model ZeRO-3's peak is 0.60x ddp's with "
        "model and 1.09x with deepspeed, its step 1.28x against 1.69x), deepspeed (its defaults, sized for "
        "billion-parameter models), model (from the model's hidden size h: as Accelerate fills \"auto\", reduce "
        "bucket h^2, ZeRO-3 "
        "prefetch bucket 0.9 h^2 (0 on the CPU, where prefetching gained nothing), persistence threshold 10 h; and "
        "ZeRO-3 optimizer sub-groups of h^2/4, at most 2 h^2 parameters gathered, reuse distance h^2; less memory and "
        "faster steps on smaller models)",
        ("--zero-buckets",), choices=ds_config.ZERO_BUCKETS))
    registry.add(sdk.Setting(
        "zero_collectives", str, "auto",
        "how ZeRO all-gathers parameters and reduce-scatters gradients: native (DeepSpeed's calls to the process "
        "group's own), p2p (isend/irecv with each peer, as fsdp's: about 4x and 2.5x faster than gloo's own); "
        "auto: p2p on gloo, native otherwise", ("--zero-collectives",), choices=zero_collectives.ZERO_COLLECTIVES))


@sdk.hookimpl
def acc_config_questions(settings: Any) -> list[str]:
    return ["zero_stage", "offload_optimizer", "offload_params", "gradient_clipping", "deepspeed_config"]


@sdk.hookimpl
def acc_validate(settings: Any) -> list[str]:
    if settings["backend"] != NAME:
        return []
    try:
        user = ds_config.read_user_config(settings["deepspeed_config"])
    except sdk.ConfigError as exc:
        return [str(exc)]
    _, problems = ds_config.complete(user, settings, world_size=None, micro_batch=None,
                                     where=ds_config.describe(settings["deepspeed_config"]))
    return problems + sdk.device_problems(settings, NAME)


@sdk.hookimpl
def acc_capabilities(settings: Any) -> sdk.Capabilities:
    stage = settings["zero_stage"] if settings["zero_stage"] is not None else 2  # the config's, measured at setup
    on_cpu = settings["cpu"] or sdk.visible_cuda_devices() == 0
    return sdk.Capabilities(
        sync="every_step", state="replicated" if stage == 0 else "sharded", reshard=False,
        distributed_type=sdk.DistributedType.DEEPSPEED,
        # DeepSpeed's CPU accelerator has no fp16; ZeRO-2/3 reduce-scatter partitioned gradients on every micro-step
        mixed_precision=("no", "bf16") if on_cpu else ("no", "fp16", "bf16"), local_micro_steps=stage < 2,
        notes=("DeepSpeed's CPU accelerator runs no fp16",) if on_cpu else (),
        mesh_dims=("dp_shard",) if stage > 0 else ("dp_replicate",))


@sdk.hookimpl
def acc_communicator(ctx: Any) -> Any:
    return sdk.TorchDistributed()


@sdk.hookimpl
def acc_launch_plan(settings: Any) -> sdk.LaunchPlan:
    cuda = sdk.visible_cuda_devices()
    on_cpu = settings["cpu"] or cuda == 0
    device = "cpu (gloo, DeepSpeed's CPU accelerator)" if on_cpu else f"cuda:<local rank> of {cuda} visible (nccl)"
    stage = settings["zero_stage"] if settings["zero_stage"] is not None else "from the config (default 2)"
    buckets = {"auto": "auto (from the model's hidden size, found at prepare; DeepSpeed's sizes where it has none)",
               "model": "from the model's hidden size, found at prepare", "deepspeed": "DeepSpeed's defaults"}
    chosen = buckets.get(settings["zero_buckets"], settings["zero_buckets"])
    plan = sdk.elastic_plan(settings, device=device,
                            notes=[f"ZeRO stage {stage}, bucket sizes the config leaves out: {chosen}"])
    if on_cpu:
        plan.env["DS_ACCELERATOR"] = "cpu"  # skip DeepSpeed's accelerator probing
    return plan


@sdk.hookimpl
def acc_env_report(settings: Any) -> dict[str, str]:
    import deepspeed

    return {"deepspeed": deepspeed.__version__}


@sdk.hookimpl
def acc_setup(ctx: sdk.RunContext) -> sdk.ProcessInfo:
    import dataclasses
    import logging
    import warnings

    info = sdk.init_process_group(ctx, NAME, "auto", distributed_type=sdk.DistributedType.DEEPSPEED)
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    # DeepSpeed still calls torch's old collective names; their deprecation warnings are not the user's to act on
    warnings.filterwarnings("ignore", message=r".*(all_gather_into_tensor|reduce_scatter_tensor).*deprecated",
                            category=FutureWarning)
    from .ops_lock import load_ops

    load_ops(say=info.local_process_index == 0)  # what init_distributed builds (or finds) under a lock file
    deepspeed.init_distributed(dist_backend=info.process_group_backend, auto_mpi_discovery=False)
    if sdk.collectives_choice(ctx.settings["zero_collectives"], info.process_group_backend) == "p2p":
        from deepspeed.comm import comm

        zero_collectives.use_p2p(comm.cdb)
    ctx.backend_state["user_config"] = ds_config.read_user_config(ctx.settings["deepspeed_config"])
    ctx.backend_config.clear()
    ctx.backend_config.update(copy.deepcopy(ctx.backend_state["user_config"]))  # scripts read it before prepare
    # DeepSpeed does mixed precision (and fp16 loss scaling) itself, from the config acc completes
    return dataclasses.replace(info, native_precision=ctx.settings["mixed_precision"] != "no")


@sdk.hookimpl
def acc_teardown(ctx: sdk.RunContext) -> None:
    sdk.destroy_process_group(ctx.settings["timeout"])


@sdk.hookimpl
def acc_init_module(ctx: sdk.RunContext, empty_init: bool | None) -> Any:
    from . import build

    config = build.init_config(ctx)
    return build.ZeroInitBuild(config) if config["zero_optimization"]["stage"] == 3 else None  # ZeRO-0/1/2: normal


def _engine(ctx: sdk.RunContext, model: Any) -> Any:
    engine = ctx.backend_state.get("engine")
    return engine if engine is not None and (model is engine or model is engine.module) else None


@sdk.hookimpl
def acc_wrap(ctx: sdk.RunContext, models: list, optimizers: list) -> tuple[list, list]:
    import deepspeed

    trained = [m for m in models if any(p.requires_grad for p in m.parameters())]
    if len(trained) > 1 or (trained and "engine" in ctx.backend_state):
        raise sdk.AccError(
            "the deepspeed backend trains one model per Accelerator (one DeepSpeed engine); got more than one model "
            "with trainable parameters. Models whose parameters are all frozen (requires_grad=False, e.g. a teacher) "
            "may be prepared alongside and are kept as they are"
        )
    if not trained:
        if any(isinstance(o, sdk.DummyOptim) for o in optimizers):
            raise sdk.AccError("a DummyOptim becomes the DeepSpeed engine's optimizer, which is built with the model: "
                               "prepare the model and its DummyOptim in the same call")
        return list(models), list(optimizers)
    if len(optimizers) != 1:
        raise sdk.AccError(f"the deepspeed backend builds its engine from the model and its optimizer together: prepare "
                           f"them in the same call (got {len(optimizers)} optimizers with the model)")
    batch_sizes = [dl.per_process_batch_size for dl in ctx.dataloaders]
    where = ds_config.describe(ctx.settings["deepspeed_config"])
    # the config as it is now: a script (transformers' Trainer) may have completed it since setup
    ctx.backend_state["user_config"] = ds_config.read_user_config(ctx.settings["deepspeed_config"])
    config, problems = ds_config.complete(ctx.backend_state["user_config"], ctx.settings, ctx.num_processes,
                                          batch_sizes[0] if batch_sizes else None, where=where)
    if "train_micro_batch_size_per_gpu" not in config:
        problems.append("the micro batch size is unknown: prepare the training DataLoader in the same prepare call as "
                        "the model, or set train_micro_batch_size_per_gpu in the DeepSpeed config")
    model_config = getattr(trained[0], "config", None)
    hidden = ds_config.hidden_size(getattr(model_config, "hidden_size", None) or
                                   getattr(model_config, "hidden_sizes", None),
                                   [tuple(getattr(p, "ds_shape", p.shape)) for p in trained[0].parameters()])
    problems += ds_config.fill_buckets(config, hidden, ctx.settings["zero_buckets"], where,
                                       cpu=getattr(ctx.device, "type", None) == "cpu")
    optimizer, scheduler = optimizers[0], sdk.scheduler_for(optimizers[0])
    split = bool(ctx.dataloaders) and ctx.dataloaders[0].settings.split_batches
    problems += ds_config.fill_optimizer_and_scheduler(config, optimizer, scheduler, ctx.num_processes, split, where)
    if problems:
        raise sdk.ConfigError("; ".join(problems))
    ctx.backend_config.clear()
    ctx.backend_config.update(config)  # the completed config the engine runs with ("auto" values filled in)
    kwargs: dict[str, Any] = {"model": trained[0], "config": config}
    if isinstance(optimizer, sdk.DummyOptim):  # the engine builds the config's optimizer over these parameters
        kwargs["model_parameters"] = list(optimizer.params)
    else:
        kwargs["optimizer"] = optimizer
    if scheduler is not None and scheduler.lr_scheduler_callable is not None:
        if "scheduler" in config:
            import warnings

            warnings.warn(f"DummyScheduler(lr_scheduler_callable=...) builds the scheduler; the \"scheduler\" section "
                          f"of {where} is not used (as with Accelerate)", stacklevel=2)
        kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable  # called with the engine's optimizer
    muon_import.import_without_compiling()  # the engine imports it: without loading inductor
    engine, engine_optimizer, _, _ = deepspeed.initialize(**kwargs)
    master.share_fp32_master(engine.optimizer)
    engine.checkpoint_engine = _safe_checkpoint_engine(engine)
    ctx.backend_state.update(engine=engine, config=config)
    if scheduler is not None:
        scheduler._bind(engine.lr_scheduler)  # stepped by the engine inside each applied optimizer step
    return [engine if m is trained[0] else m for m in models], [engine_optimizer]


@sdk.hookimpl
def acc_unwrap_model(ctx: sdk.RunContext, model: Any) -> Any:
    engine = _engine(ctx, model)
    return engine.module if engine is not None else model


@sdk.hookimpl
def acc_no_sync(ctx: sdk.RunContext, model: Any) -> Any:
    return contextlib.nullcontext()  # the engine learns the boundary in acc_backward


@sdk.hookimpl
def acc_backward(ctx: sdk.RunContext, loss: Any, kwargs: dict) -> bool:
    engine = ctx.backend_state.get("engine")
    if engine is None:
        loss.backward(**kwargs)
        return True
    engine.set_gradient_accumulation_boundary(ctx.loop.sync_gradients)
    engine.backward(loss, scale_wrt_gas=False, **kwargs)  # acc already divided the loss by the accumulation steps
    return True


@sdk.hookimpl
def acc_optimizer_step(ctx: sdk.RunContext, optimizer: Any) -> bool:
    engine = ctx.backend_state.get("engine")
    if engine is None or optimizer is not engine.optimizer:
        optimizer.step()
        return True
    engine.step()
    return bool(engine.was_step_applied())


@sdk.hookimpl
def acc_clip_grad_norm(ctx: sdk.RunContext, parameters: list, max_norm: float, norm_type: float) -> Any:
    import torch

    engine = ctx.backend_state.get("engine")
    if engine is None:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
    config = ctx.backend_state["config"]
    configured = float(config.get("gradient_clipping") or 0.0)
    if configured != float(max_norm):
        if configured and ctx.backend_state.get("clipping_from") != "code":
            raise sdk.AccError(
                f"under DeepSpeed the engine clips inside its step, with the configured gradient_clipping "
                f"({configured}); clip_grad_norm_ asked for {max_norm}: make them agree (--gradient-clipping "
                f"{max_norm}, or gradient_clipping in the DeepSpeed config)"
            )
        # nothing configured: the engine clips to what the script asks, from this step on
        config["gradient_clipping"] = float(max_norm)
        ctx.backend_state["clipping_from"] = "code"
        engine._config.gradient_clipping = float(max_norm)
        if hasattr(engine.optimizer, "clip_grad"):
            engine.optimizer.clip_grad = float(max_norm)
    norm = engine.get_global_grad_norm()  # the engine's global norm of the last applied step
    return torch.tensor(float(norm) if norm is not None else float("nan"))


# ------------------------------------------------------------------------------ checkpoints


def _safe_checkpoint_engine(engine: Any) -> Any:
    """DeepSpeed's torch checkpoint engine, loading with `weights_only=True` and an allowlist of the few
    DeepSpeed classes its files hold, so loading a checkpoint never runs code from it."""
    import torch
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    allowed = _allowed_globals()

    class SafeTorchCheckpointEngine(TorchCheckpointEngine):
        def load(self, path: str, map_location: Any = None) -> Any:

            manifest = ctx_manifest.get("manifest")
            if manifest is not None:

                relative = os.path.relpath(path, ctx_manifest["directory"])
                sdk.verify(Path(ctx_manifest["directory"]), manifest, relative)
            try:
                with torch.serialization.safe_globals(allowed):
                    return torch.load(path, map_location=map_location, weights_only=True)
            except Exception as exc:  # noqa: BLE001 - an unreadable or unsafe file is named, never unpickled
                raise sdk.CheckpointError(f"{path}: refused or unreadable: {str(exc).splitlines()[0]}") from None

    safe = SafeTorchCheckpointEngine(getattr(engine, "_config", None))
    return safe


ctx_manifest: dict[str, Any] = {}  # the checkpoint being loaded (set around engine.load_checkpoint)


def _allowed_globals() -> list:
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def _files_of(rank: int, root: Path) -> list[str]:
    """The files of the DeepSpeed checkpoint under `root` that process `rank` wrote."""
    out = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        name = path.name
        mine = f"zero_pp_rank_{rank}_" in name if "zero_pp_rank_" in name else rank == 0
        if mine:
            out.append(str(path.relative_to(root.parent)))
    return out


@sdk.hookimpl
def acc_save_checkpoint(ctx: sdk.RunContext, directory: Any, models: list, optimizers: list) -> list[str]:

    engine = ctx.backend_state.get("engine")
    if engine is None:
        return None  # no engine (nothing trained): the defaults write the models
    engine.save_checkpoint(str(directory / SUBDIR), tag=TAG, save_latest=False)
    ckpt_dir = directory / SUBDIR
    written = [str(Path(SUBDIR) / f) for f in _files_of(ctx.process_index, ckpt_dir / TAG)]
    others = [m for m in models if m is not engine.module]
    if others and ctx.process_index == 0:  # frozen models prepared alongside (e.g. a teacher)
        for i, model in enumerate(models):
            if model is not engine.module:
                sdk.save_tensors(model.state_dict(), directory / f"model_{i}.safetensors")
                written.append(f"model_{i}.safetensors")
    return written


@sdk.hookimpl
def acc_load_checkpoint(ctx: sdk.RunContext, directory: Any, models: list, optimizers: list, manifest: dict) -> bool:

    engine = ctx.backend_state.get("engine")
    if engine is None:
        return None
    saved = manifest.get("run", {}).get("processes", {}).get("num_processes")
    if saved is not None and saved != ctx.num_processes:
        raise sdk.CheckpointError(f"{directory}: a DeepSpeed ZeRO checkpoint loads on the number of processes that "
                                   f"saved it ({saved}); this run has {ctx.num_processes}")
    if not any(name.startswith(SUBDIR + "/") for name in manifest.get("files", {})):
        raise sdk.CheckpointError(f"{directory}: holds no DeepSpeed engine state; was it saved by another backend "
                                   f"({manifest.get('run', {}).get('backend')})?")
    ctx_manifest.update(manifest=manifest, directory=str(directory))
    try:
        # a scheduler the engine built (the config's, or DummyScheduler's callable) is restored with the engine;
        # the script's own torch schedulers are restored by the kernel
        path, _ = engine.load_checkpoint(str(directory / SUBDIR), tag=TAG,
                                         load_lr_scheduler_states=engine.lr_scheduler is not None)
    finally:
        ctx_manifest.clear()
    if path is None:
        raise sdk.CheckpointError(f"{directory / SUBDIR}: DeepSpeed found no checkpoint to load")
    for i, model in enumerate(models):
        if model is not engine.module:
            model.load_state_dict(sdk.load_tensors(sdk.verify(directory, manifest, f"model_{i}.safetensors"),
                                                    device=ctx.device), strict=True)
    return True


@sdk.hookimpl
def acc_model_state_dict(ctx: sdk.RunContext, model: Any) -> dict:
    engine = ctx.backend_state.get("engine")
    if engine is None or model is not engine.module:
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if ctx.backend_state["config"]["zero_optimization"]["stage"] == 3:
        state = engine._zero3_consolidated_16bit_state_dict()  # gathered to the main process
        return {k: v.detach().cpu() for k, v in (state or {}).items()} if ctx.process_index == 0 else {}
    return {k: v.detach().cpu() for k, v in engine.module.state_dict().items()}


@sdk.hookimpl
def acc_merge_weights(directory: Any, manifest: dict, index: int, out: Any) -> list[str]:
    """The engine model's fp32 weights from DeepSpeed's ZeRO files (DeepSpeed's zero_to_fp32), read with the same
    weights_only loading as load_state; a model prepared beside the engine was saved whole (model_<i>)."""
    import torch
    from deepspeed.utils import zero_to_fp32

    files = manifest.get("files", {})
    whole = f"model_{index}.safetensors"
    if whole in files:
        raise sdk.CheckpointError(f"{directory}: model #{index} was saved whole, not by the engine: "
                                  f"{directory / whole} is its weights already")
    if not any(name.startswith(SUBDIR + "/") for name in files):
        raise sdk.CheckpointError(f"{directory}: holds no DeepSpeed engine state")
    for name in files:
        if name.startswith(SUBDIR + "/"):
            sdk.verify(directory, manifest, name)  # every file DeepSpeed will read is the one acc wrote
    allowed, plain_load = _allowed_globals(), torch.load

    def safe_load(path: Any, map_location: Any = None, **_: Any) -> Any:
        relative = os.path.relpath(os.fspath(path), directory)
        if relative not in files:  # zero_to_fp32 finds its files by globbing: only the verified ones are read
            raise sdk.CheckpointError(f"{path}: DeepSpeed asked for a file the manifest of {directory} does not list; "
                                      "refused (acc reads only the checkpoint's own, verified files)")
        with torch.serialization.safe_globals(allowed):
            return plain_load(path, map_location=map_location, weights_only=True)

    with contextlib.redirect_stdout(None):  # zero_to_fp32 prints its progress
        torch.load = safe_load
        try:
            state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(directory / SUBDIR), tag=TAG)
        finally:
            torch.load = plain_load
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    sdk.save_tensors(state, out)
    return sorted(state)
