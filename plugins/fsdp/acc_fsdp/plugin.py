"""The fsdp backend's hooks: torch's `fully_shard` (FSDP2) over the kernel's elastic launch and collectives.

Launcher-side hooks are torch-free; torch is imported inside worker hooks only.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from acc import backend as sdk

from . import build, keep_unsharded, tuning

ACC_HOOKSPEC_VERSION = 2
ACC_REQUIRES = ("torch",)
NAME = "fsdp"
STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard")
PIECES = "fsdp_rank{rank}.safetensors"
GROUPS = "fsdp_optimizer_{index}_groups.pt"


@sdk.hookimpl
def acc_add_settings(registry: Any) -> None:
    registry.add(sdk.Setting(
        "fsdp_wrap", str, "auto",
        "what to shard besides the root: transformer_layer=ClassA[,ClassB] (by class name), no_split_modules (the "
        "classes the model's _no_split_modules names: Accelerate's TRANSFORMER_BASED_WRAP without classes), "
        "min_params=N, none (the root alone: Accelerate's NO_WRAP), or auto: the model's repeated blocks, found at prepare (the children of "
        "its largest ModuleList/Sequential whose children are of one class and hold at least half the parameters; "
        "none found: the root alone). The bench model's peak fell from 0.74x to 0.55x ddp's with blocks as units",
        ("--fsdp-wrap",),
    ))
    registry.add(sdk.Setting(
        "fsdp_strategy", str, "full_shard",
        "full_shard; shard_grad_op (keep parameters gathered between forward and backward); hybrid_shard "
        "(shard within a machine, replicate across machines)", ("--fsdp-strategy",), choices=STRATEGIES,
    ))
    registry.add(sdk.Setting("fsdp_cpu_offload", bool, False, "keep sharded parameters on the CPU between uses",
                         ("--fsdp-cpu-offload",)))
    registry.add(sdk.Setting(
        "fsdp_from_rank0", bool, False,
        "take every parameter and buffer from process 0 at prepare (Accelerate's sync_module_states / "
        "cpu_ram_efficient_loading): the other processes may build on the meta device and receive only their shards",
        ("--fsdp-from-rank0",)))
    # step speed (acc_fsdp/tuning.py; defaults measured in bench/sharded.py)
    registry.add(sdk.Setting(
        "fsdp_reduce_scatter", str, "auto",
        "how gradients are reduce-scattered: native (the process group's own), all_to_all (chunks exchanged with "
        "all_to_all_single, then summed locally: half the volume of gloo's own), p2p (the same exchange as isend/irecv "
        "to each peer: 2.5-3x faster than all_to_all on gloo); auto: p2p on gloo, native otherwise",
        ("--fsdp-reduce-scatter",), choices=tuning.REDUCE_SCATTER))
    registry.add(sdk.Setting(
        "fsdp_all_gather", str, "auto",
        "how parameters are all-gathered: native (the process group's own), p2p (each shard sent with isend/irecv "
        "to each peer: about 4x faster than gloo's own); auto: p2p on gloo, native otherwise",
        ("--fsdp-all-gather",), choices=tuning.ALL_GATHER))
    registry.add(sdk.Setting(
        "fsdp_prefetch", int, 1,
        "units whose all-gather starts ahead, in the background, in forward (and in backward where "
        "fsdp_prefetch_in_backward is on) (0: FSDP2's own, which on the CPU waits for each all-gather); units are "
        "taken in the order the model defines them",
        ("--fsdp-prefetch",), minimum=0, maximum=8))
    registry.add(sdk.Setting(
        "fsdp_prefetch_in_backward", str, "auto",
        "whether backward gathers the next unit's parameters while this unit computes: on (FSDP2's default), off "
        "(each unit is gathered when its own backward starts: one unit's parameters less at the backward peak); "
        "auto: off on gloo, where the prefetch made the step no faster, on otherwise",
        ("--fsdp-prefetch-in-backward",), choices=tuning.PREFETCH_IN_BACKWARD))
    registry.add(sdk.Setting(
        "fsdp_keep_last_unsharded", bool, True,
        "keep the last units' parameters gathered after forward (backward needs them first), as many as "
        "fsdp_keep_unsharded says: one all-gather less per step for each; false: none", ("--fsdp-keep-last-unsharded",)))
    registry.add(sdk.Setting(
        "fsdp_keep_unsharded", str, "auto",
        "how many of the last units stay gathered between forward and backward: a number, or auto: as many as fit "
        "under the peak backward reaches later, from the activations and gradient shards measured at the first "
        "step (the bench model keeps 4 of 8, its peak unchanged; a model whose activations outweigh its gradient "
        "shards keeps 1); see acc_fsdp/keep_unsharded.py", ("--fsdp-keep-unsharded",)))


@sdk.hookimpl
def acc_config_questions(settings: Any) -> list[str]:
    return ["fsdp_wrap", "fsdp_strategy", "fsdp_cpu_offload"]


def parse_wrap(value: str | None) -> tuple[str, Any]:
    """("none", None), ("auto", None), ("classes", [names]) or ("min_params", N); ValueError with the valid forms."""
    if not value or value == "none":
        return "none", None
    if value == "auto":
        return "auto", None
    if value == "no_split_modules":
        return "classes", None
    kind, _, arg = value.partition("=")
    if kind == "transformer_layer" and arg:
        return "classes", [c.strip() for c in arg.split(",") if c.strip()]
    if kind == "min_params" and arg.isdigit():
        return "min_params", int(arg)
    raise ValueError(f"fsdp_wrap {value!r}: expected auto, none, transformer_layer=ClassName[,ClassName], "
                     "no_split_modules or min_params=N")


@sdk.hookimpl
def acc_validate(settings: Any) -> list[str]:
    if settings["backend"] != NAME:
        return []
    problems = []
    try:
        parse_wrap(settings["fsdp_wrap"])
    except ValueError as exc:
        problems.append(f"{exc} (from {settings.source('fsdp_wrap')})")
    try:
        keep_unsharded.parse(settings["fsdp_keep_unsharded"])
    except ValueError as exc:
        problems.append(f"{exc} (from {settings.source('fsdp_keep_unsharded')})")
    if settings["fsdp_strategy"] == "hybrid_shard" and settings["num_machines"] == 1:
        problems.append("fsdp_strategy 'hybrid_shard' replicates across machines and shards within one, but "
                        "num_machines is 1; use full_shard on one machine")
    return problems + sdk.device_problems(settings, NAME)


@sdk.hookimpl
def acc_capabilities(settings: Any) -> sdk.Capabilities:
    # no fp16: it would need a sharded gradient scaler; bf16 needs no scaling
    return sdk.Capabilities(sync="every_step", state="sharded", reshard=True,
                            distributed_type=sdk.DistributedType.FSDP, mixed_precision=("no", "bf16"),
                            compile="backend", notes=("fp16 would need a sharded gradient scaler: use bf16",),
                            mesh_dims=("dp_replicate", "dp_shard", "tp", "cp"))


@sdk.hookimpl
def acc_communicator(ctx: Any) -> Any:
    return sdk.TorchDistributed()


@sdk.hookimpl
def acc_launch_plan(settings: Any) -> sdk.LaunchPlan:
    cuda = sdk.visible_cuda_devices()
    device = "cpu (gloo)" if settings["cpu"] or cuda == 0 else f"cuda:<local rank> of {cuda} visible (nccl)"
    wrap = {"auto": "auto (the model's repeated blocks, found at prepare)", "none": "root only", "": "root only",
            "no_split_modules": "the classes the model's _no_split_modules names (found at prepare)"}
    chosen = wrap.get(settings["fsdp_wrap"] or "", settings["fsdp_wrap"])
    notes = [f"sharding: {settings['fsdp_strategy']}, wrap: {chosen}"
             + (", parameters offloaded to CPU" if settings["fsdp_cpu_offload"] else "")]
    return sdk.elastic_plan(settings, device=device, notes=notes)


@sdk.hookimpl
def acc_setup(ctx: sdk.RunContext) -> sdk.ProcessInfo:
    import dataclasses

    info = sdk.init_process_group(ctx, NAME, "auto", distributed_type=sdk.DistributedType.FSDP)
    # bf16 is applied by FSDP's mixed-precision policy (parameters cast per shard, reductions in fp32)
    return dataclasses.replace(info, native_precision=ctx.settings["mixed_precision"] == "bf16")


@sdk.hookimpl
def acc_teardown(ctx: sdk.RunContext) -> None:
    sdk.destroy_process_group(ctx.settings["timeout"])


def _mesh(ctx: sdk.RunContext) -> Any:
    """The mesh fully_shard shards over: the run mesh's dp dims (dp_shard, or dp_replicate x dp_shard: HSDP) where
    the script gave a ParallelismConfig (dp_shard x cp flattened, `dp_shard_cp`, when cp is above 1), else the world
    (machines x processes under hybrid_shard); None when the ParallelismConfig has no dp or cp dim above 1 (tensor
    parallel alone: nothing to shard over)."""
    from torch.distributed.device_mesh import init_device_mesh

    if "mesh" in ctx.backend_state:
        return ctx.backend_state["mesh"]
    mesh, run = None, sdk.run_mesh(ctx)
    if run is not None:
        names = run.mesh_dim_names or ()
        if ctx.settings["fsdp_strategy"] == "hybrid_shard":
            raise sdk.AccError("fsdp_strategy 'hybrid_shard' and a ParallelismConfig both say how to replicate: give "
                               "ParallelismConfig(dp_replicate_size=..., dp_shard_size=...) alone (HSDP)")
        if "dp_replicate" in names and "dp_shard" not in names and "cp" not in names:
            raise sdk.AccError("ParallelismConfig(dp_replicate_size>1) with dp_shard_size 1: the fsdp backend shards; "
                               "give dp_shard_size > 1 too (HSDP), or run pure replication on the ddp backend")
        if "cp" in names:
            # the ranks of a cp group hold different parts of each sequence and their gradients are averaged too:
            # fully_shard shards over dp_shard x cp flattened (Accelerate's fsdp_dim_names)
            dp: tuple[str, ...] = ("dp_replicate", "dp_shard_cp") if "dp_replicate" in names else ("dp_shard_cp",)
        else:
            dp = tuple(d for d in ("dp_replicate", "dp_shard") if d in names)
        mesh = run[dp] if dp else None
    else:
        world, kind = ctx.num_processes, ctx.device.type
        if ctx.settings["fsdp_strategy"] == "hybrid_shard":
            machines = ctx.settings["num_machines"]
            mesh = init_device_mesh(kind, (machines, world // machines), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(kind, (world,), mesh_dim_names=("shard",))
    ctx.backend_state["mesh"] = mesh
    return mesh


def _tp_mesh(ctx: sdk.RunContext) -> Any:
    """The run mesh's tp dimension, or None (no ParallelismConfig, or tp_size 1)."""
    run = sdk.run_mesh(ctx)
    return run["tp"] if run is not None and "tp" in (run.mesh_dim_names or ()) else None


def _shard(ctx: sdk.RunContext, model: Any) -> list[Any]:
    """Apply fully_shard to the submodules the wrap policy names (bottom-up), then to the root; return the
    sharded submodules (the units besides the root) in forward order."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": _mesh(ctx),
                              "reshard_after_forward": ctx.settings["fsdp_strategy"] != "shard_grad_op"}
    root_mp = None
    if ctx.settings["mixed_precision"] == "bf16":
        # inner units compute and hand on bf16; the root hands the user float32 outputs
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        root_mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                       output_dtype=torch.float32)
    if ctx.settings["fsdp_cpu_offload"]:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    kind, arg = parse_wrap(ctx.settings["fsdp_wrap"])
    if kind == "classes" and arg is None:  # no_split_modules: the classes the model names, as Accelerate reads them
        arg = list(getattr(model, "_no_split_modules", None) or [])
        if not arg:
            raise sdk.AccError(f"fsdp_wrap no_split_modules (Accelerate's TRANSFORMER_BASED_WRAP without classes): "
                               f"the model ({type(model).__name__}) has no _no_split_modules; name the classes "
                               "(--fsdp-wrap transformer_layer=ClassName, or fsdp_transformer_layer_cls_to_wrap)")
    if kind == "classes":
        found = {type(m).__name__ for m in model.modules()}
        unknown = [c for c in arg if c not in found]
        if unknown:
            raise sdk.AccError(f"fsdp_wrap names class(es) {', '.join(unknown)}, which the model does not contain; "
                               f"its module classes are: {', '.join(sorted(found))}")
        targets = [m for m in model.modules() if type(m).__name__ in arg and m is not model]
    elif kind == "min_params":
        targets, pending = [], {}
        for name, module in reversed(list(model.named_modules())):  # children before parents
            own = sum(p.numel() for p in module.parameters(recurse=False))
            pending[name] = own + sum(pending.pop(f"{name}.{c}" if name else c, 0) for c, _ in module.named_children())
            if module is not model and pending[name] >= arg:
                targets.append(module)
                pending[name] = 0
    elif kind == "auto":
        targets = repeated_blocks(model)
    else:
        targets = []
    ctx.backend_state.setdefault("units", []).append(
        f"{len(targets)} x {type(targets[0]).__name__}" if targets else "the root alone")  # what the wrap chose
    position = {id(m): i for i, m in enumerate(model.modules())}
    ordered = sorted(targets, key=lambda m: position[id(m)])  # the order the model defines them (forward order)
    for module in targets:  # children before parents
        fully_shard(module, **dict(kwargs, reshard_after_forward=tuning.reshard_after_forward(
            ctx, ordered.index(module), len(ordered))))
    fully_shard(model, **dict(kwargs, **({"mp_policy": root_mp} if root_mp is not None else {})))
    tuning.apply(ctx, model, ordered)
    return ordered


def repeated_blocks(model: Any) -> list[Any]:
    """fsdp_wrap auto's units: the children (those with parameters) of the model's ModuleList or Sequential whose
    children are all of one class and hold the most parameters, when they hold at least half of the model's (a
    transformer's layers); else none (the root alone)."""
    from torch import nn

    total = sum(p.numel() for p in model.parameters())
    best: list[Any] = []
    most = 0
    for module in model.modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        kids = [c for c in module.children() if next(c.parameters(), None) is not None]
        if len(kids) < 2 or len({type(c) for c in kids}) != 1:
            continue
        held = sum(p.numel() for c in kids for p in c.parameters())
        if held > most:
            best, most = kids, held
    return best if total and 2 * most >= total else []


@sdk.hookimpl
def acc_init_module(ctx: sdk.RunContext, empty_init: bool | None) -> sdk.ShardedBuild | None:
    run = sdk.run_mesh(ctx)
    if run is not None and tuple(run.mesh_dim_names or ()) != ("dp_shard",):
        return None  # tensor parallel and HSDP split parameters otherwise than dim 0 over the world: a normal build
    return build.new_build(ctx, empty_init)


@sdk.hookimpl
def acc_wrap(ctx: sdk.RunContext, models: list, optimizers: list) -> tuple[list, list]:
    from torch.distributed.fsdp import FSDPModule

    known = ctx.backend_state.setdefault("optimizers", [])
    known.extend(o for o in optimizers if o not in known)
    for model in models:
        if isinstance(model, FSDPModule):
            continue
        before = {id(p): name for name, p in model.named_parameters()}
        parts = build.initial_parts(ctx, model)  # None: shard the model as it is
        for opt in known:  # the optimizer must be built on the sharded parameters: rebind it, before any step
            if any(id(p) in before for g in opt.param_groups for p in g["params"]) and opt.state:
                raise sdk.AccError(
                    f"an optimizer ({type(opt).__name__}) already has state for this model's parameters; fsdp "
                    "replaces the parameters when it shards, so prepare the model and optimizer before the first "
                    "optimizer step (e.g. model, optimizer = accelerator.prepare(model, optimizer))"
                )
        run = sdk.run_mesh(ctx)
        if parts is not None and run is not None and tuple(run.mesh_dim_names or ()) != ("dp_shard",):
            raise sdk.AccError(f"a ParallelismConfig over {' x '.join(run.mesh_dim_names or ())} takes a model built "
                               "whole on each process: build it without init_empty_weights() and without "
                               "fsdp_from_rank0 (they split parameters along dim 0 over every process, for fsdp alone)")
        tp = _tp_mesh(ctx)
        if tp is not None:
            sdk.apply_tensor_parallel(model, tp)  # TP first; fully_shard then shards the DTensors over dp
        if parts is not None:
            build.to_meta(model)
        units = _shard(ctx, model) if _mesh(ctx) is not None else []
        if parts is not None:
            build.fill_shards(ctx, model, parts)
        # torch.compile per unit (Capabilities(compile="backend")): each sharded unit compiled in place, so its
        # all-gather/reduce-scatter hooks run around the compiled graph; with no unit besides the root, the root
        sdk.compile_units(ctx, units or [model])
        after = dict(model.named_parameters())
        for opt in known:
            for group in opt.param_groups:
                group["params"] = [after[before[id(p)]] if id(p) in before else p for p in group["params"]]
        ctx.backend_state.setdefault("models", []).append(model)
    return list(models), list(optimizers)


@sdk.hookimpl
def acc_no_sync(ctx: sdk.RunContext, model: Any) -> Any:
    return _without_gradient_sync(model)


@contextlib.contextmanager
def _without_gradient_sync(model: Any) -> Iterator[None]:
    setter = getattr(model, "set_requires_gradient_sync", None)
    if setter is None:
        yield
        return
    setter(False)
    try:
        yield
    finally:
        setter(True)


@sdk.hookimpl
def acc_clip_grad_norm(ctx: sdk.RunContext, parameters: list, max_norm: float, norm_type: float) -> Any:
    import torch
    from torch.distributed.tensor import DTensor

    # grads on different meshes (tensor-parallel weights on dp x tp, the rest on dp) cannot be stacked: one norm
    # per mesh, each over all its shards, then combined
    groups: dict[Any, list[Any]] = {}
    for p in parameters:
        if p.grad is not None:
            groups.setdefault(id(p.grad.device_mesh) if isinstance(p.grad, DTensor) else None, []).append(p)
    norms = []
    for params in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # the norm over every shard
    if not norms:
        return torch.zeros(())
    total = norms[0] if len(norms) == 1 else torch.nn.utils.get_total_norm(norms, norm_type=norm_type)
    for params in groups.values():  # scaled group by group (a DTensor and a Tensor do not mix in one foreach)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


@sdk.hookimpl(wrapper=True)
def acc_backward(ctx: sdk.RunContext, loss: Any, kwargs: dict) -> Iterator[None]:
    """Backward itself is the default's; when it starts, fsdp_keep_unsharded auto ends its first-step measurement."""
    for keeper in ctx.backend_state.get("keepers", []):
        keeper.backward_starts()
    return (yield)


# ------------------------------------------------------------------------------ checkpoints: pieces per rank


@sdk.hookimpl
def acc_save_checkpoint(ctx: sdk.RunContext, directory: Any, models: list, optimizers: list) -> list[str]:

    tensors = {}
    for i, model in enumerate(models):
        tensors.update({sdk.model_prefix(i) + k: v for k, v in model.state_dict().items()})
    written = []
    for i, opt in enumerate(optimizers):
        state = opt.state_dict()
        for index, entries in state["state"].items():
            tensors.update({f"optim.{i}.{index}.{k}": v for k, v in entries.items() if hasattr(v, "shape")})
        if ctx.process_index == 0:
            extras = {"param_groups": state["param_groups"],
                      "scalars": {str(index): {k: v for k, v in entries.items() if not hasattr(v, "shape")}
                                  for index, entries in state["state"].items()}}
            sdk.save_object(extras, directory / GROUPS.format(index=i))
            written.append(GROUPS.format(index=i))
    name = PIECES.format(rank=ctx.process_index)
    sdk.save_pieces(tensors, directory / name)
    return [name, *written]


def _local(full: Any, like: Any) -> Any:
    """`full` laid out like `like` (a DTensor gets this process's shard, without communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(like, DTensor):
        return distribute_tensor(full.to(like.device, like.dtype), like.device_mesh, like.placements,
                                 src_data_rank=None)
    return full.to(like.device) if hasattr(like, "device") else full


@sdk.hookimpl
def acc_load_checkpoint(ctx: sdk.RunContext, directory: Any, models: list, optimizers: list, manifest: dict) -> bool:
    import re


    names = sorted(n for n in manifest.get("files", {}) if re.fullmatch(r"fsdp_rank\d+\.safetensors", n))
    if not names:
        raise sdk.CheckpointError(f"{directory}: holds no fsdp piece files (fsdp_rank<N>.safetensors); was it saved "
                                   f"by another backend ({manifest.get('run', {}).get('backend')})?")
    reader = sdk.ShardedReader([sdk.verify(directory, manifest, n) for n in names])
    for i, model in enumerate(models):
        current = model.state_dict()
        missing = [k for k in current if sdk.model_prefix(i) + k not in reader.index]
        if missing:
            raise sdk.CheckpointError(f"{directory}: model #{i} has {len(missing)} tensor(s) the checkpoint lacks, "
                                       f"e.g. {', '.join(missing[:3])}")
        model.load_state_dict({k: _local(reader.full(sdk.model_prefix(i) + k), v) for k, v in current.items()}, strict=True)
    for i, opt in enumerate(optimizers):
        extras = sdk.load_object(sdk.verify(directory, manifest, GROUPS.format(index=i)))
        params = [p for g in opt.param_groups for p in g["params"]]
        state: dict[int, dict] = {}
        for index_text, scalars in extras["scalars"].items():
            state[int(index_text)] = dict(scalars)
        prefix = f"optim.{i}."
        for name in reader.names():
            if name.startswith(prefix):
                index_text, key = name[len(prefix):].split(".", 1)
                index = int(index_text)
                like = params[index] if key not in ("step",) else None
                full = reader.full(name)
                state.setdefault(index, {})[key] = _local(full, like) if like is not None else full
        opt.load_state_dict({"state": state, "param_groups": extras["param_groups"]})
    return True


@sdk.hookimpl
def acc_model_state_dict(ctx: sdk.RunContext, model: Any) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # gathered shard by shard to the main process (on CPU); the other processes get an empty dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
