"""Accelerate's backend plugin objects with its field names and defaults: `DeepSpeedPlugin`,
`FullyShardedDataParallelPlugin`, `TorchDynamoPlugin`, and the `ProfileKwargs` handler. Torch-free (torch
objects a script passes, e.g. `ShardingStrategy.FULL_SHARD` or `CPUOffloadPolicy()`, are read by name).

A backend plugin object configures one acc backend (`backend`): `to_settings()` maps the fields that were given
onto that backend's own settings (the ones `acc launch --backend NAME --help` lists), which
`Accelerator(deepspeed_plugin=..., fsdp_plugin=...)` applies as code settings. A field left at its default sets
nothing (the launch's settings stay); a field acc cannot honour is an `AccError` naming it, its value and what acc
offers instead, never silently ignored. Fields FSDP2 has no use for (acc's fsdp backend runs FSDP2) are accepted
with a warning, as Accelerate's own FSDP2 conversion drops them.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional

from acc.compat.environment import clear_environment, str_to_bool
from acc.contract.enums import DynamoBackend
from acc.contract.kwargs import KwargsHandler
from acc.errors import AccError


def _given(value: Any) -> bool:
    """False for Accelerate's spellings of "not given" (None, "none", "auto")."""
    return value is not None and not (isinstance(value, str) and value.strip().lower() in ("", "none", "auto"))


def _name(value: Any) -> Any:
    """An enum member (torch's ShardingStrategy, StateDictType, BackwardPrefetch, ...) as its name."""
    return value.name if hasattr(type(value), "__members__") and hasattr(value, "name") else value


class _Refusals:
    """Collects the fields acc cannot honour; `raise_if_any` raises one AccError listing them all."""

    def __init__(self, owner: str):
        self.owner, self.items = owner, []

    def add(self, name: str, value: Any, offer: str) -> None:
        self.items.append(f"{self.owner}({name}={value!r}): {offer}")

    def raise_if_any(self) -> None:
        if len(self.items) == 1:
            raise AccError(self.items[0])
        if self.items:
            raise AccError(f"{len(self.items)} fields acc cannot honour:\n" + "\n".join(f"  - {i}" for i in self.items))


# ---------------------------------------------------------------------------------------------- DeepSpeed


@dataclass
class DeepSpeedPlugin:
    """DeepSpeed (Accelerate's fields and defaults); configures acc's deepspeed backend.

    `hf_ds_config`: a DeepSpeed JSON file's path, a dict, or an object with a `config` dict (HfDeepSpeedConfig);
    its "auto" values are filled by acc as by Accelerate, and its "optimizer"/"scheduler" sections are used with
    `acc.utils.DummyOptim`/`DummyScheduler`. `zero_stage`, `gradient_accumulation_steps`, `gradient_clipping`,
    `offload_optimizer_device`/`offload_param_device` ("none" or "cpu") map onto acc's settings of those names.
    `zero3_save_16bit_model`: accepted either way (acc's save_model always gathers the full ZeRO-3 weights).
    Not offered: NVMe offload, `zero3_init_flag=True`, `transformer_moe_cls_names`, `enable_msamp=True`,
    `is_train_batch_min=False` (acc takes the micro batch size from the first prepared DataLoader).
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int = None
    gradient_clipping: float = None
    zero_stage: int = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str = None
    offload_param_device: str = None
    offload_optimizer_nvme_path: str = None
    offload_param_nvme_path: str = None
    zero3_init_flag: bool = None
    zero3_save_16bit_model: bool = None
    transformer_moe_cls_names: str = None
    enable_msamp: bool = None
    msamp_opt_level: Optional[str] = None

    @property
    def backend(self) -> str:
        """The acc backend this plugin configures."""
        return "deepspeed"

    def to_settings(self) -> dict[str, object]:
        """The deepspeed backend's settings these fields ask for (fields left at their defaults set nothing)."""
        out: dict[str, object] = {}
        no = _Refusals("DeepSpeedPlugin")
        config = self.hf_ds_config
        if _given(config):
            if isinstance(config, (str, os.PathLike)):
                out["deepspeed_config"] = os.fspath(config)
            else:
                data = config if isinstance(config, dict) else getattr(config, "config", None)
                if not isinstance(data, dict):
                    no.add("hf_ds_config", config, "give a DeepSpeed JSON file's path, a dict, or an HfDeepSpeedConfig")
                else:
                    try:
                        out["deepspeed_config"] = json.dumps(data)  # the backend's setting takes the JSON itself
                    except (TypeError, ValueError) as exc:
                        no.add("hf_ds_config", config, f"the config must be JSON data (numbers, strings, lists, "
                               f"dicts): {exc}")
        steps = self.gradient_accumulation_steps
        if _given(steps):
            if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1:
                out["gradient_accumulation_steps"] = steps
            else:
                no.add("gradient_accumulation_steps", steps, "give a positive integer, or \"auto\" for the "
                       "Accelerator's gradient_accumulation_steps")
        clip = self.gradient_clipping
        if _given(clip):
            if isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip >= 0:
                out["gradient_clipping"] = float(clip)
            else:
                no.add("gradient_clipping", clip, "give a total norm >= 0 (a float), or \"auto\"")
        stage = self.zero_stage
        if stage is not None:
            if stage in (0, 1, 2, 3) and not isinstance(stage, bool):
                out["zero_stage"] = int(stage)
            else:
                no.add("zero_stage", stage, "ZeRO stages are 0, 1, 2 and 3")
        if self.is_train_batch_min is not True:
            no.add("is_train_batch_min", self.is_train_batch_min, "acc takes the micro batch size from the first "
                   "DataLoader prepared with the model; set train_micro_batch_size_per_gpu in the DeepSpeed config to "
                   "choose another")
        for name, setting in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device",
                                                                                   "offload_params")):
            device = getattr(self, name)
            if not _given(device):
                continue
            if str(device).strip().lower() == "cpu":
                out[setting] = "cpu"
            else:
                no.add(name, device, f"acc offloads ZeRO state to the CPU only: {name}=\"cpu\" (or \"none\"), the "
                       f"--{setting.replace('_', '-')} cpu setting")
        for name in ("offload_optimizer_nvme_path", "offload_param_nvme_path"):
            if _given(getattr(self, name)):
                no.add(name, getattr(self, name), "acc has no NVMe offload; offload to the CPU instead "
                       "(offload_optimizer_device=\"cpu\", offload_param_device=\"cpu\")")
        if self.zero3_init_flag:
            no.add("zero3_init_flag", self.zero3_init_flag, "acc does not build the model under deepspeed.zero.Init; "
                   "every process builds it and ZeRO-3 partitions it in prepare() (zero_stage=3); leave it False")
        if _given(self.transformer_moe_cls_names):
            no.add("transformer_moe_cls_names", self.transformer_moe_cls_names, "acc does not mark MoE leaf modules "
                   "yet; call deepspeed.utils.set_z3_leaf_modules(model, [YourMoeBlock]) before prepare and leave "
                   "this unset")
        if self.enable_msamp:
            no.add("enable_msamp", self.enable_msamp, "acc has no fp8 (MS-AMP); its mixed precision is no, fp16 or "
                   "bf16 (Accelerator(mixed_precision=...))")
        no.raise_if_any()
        return out


# ---------------------------------------------------------------------------------------------- FSDP


@dataclass
class FullyShardedDataParallelPlugin:
    """Fully sharded data parallelism (Accelerate's fields and defaults); configures acc's fsdp backend, which runs
    FSDP2 (torch's `fully_shard`): the fields mean what Accelerate's FSDP2 makes of them.

    `sharding_strategy` / `reshard_after_forward` -> the fsdp_strategy setting (FULL_SHARD or True: full_shard,
    SHARD_GRAD_OP or False: shard_grad_op, HYBRID_SHARD: hybrid_shard); `auto_wrap_policy` with
    `transformer_cls_names_to_wrap` or `min_num_params` -> fsdp_wrap; `cpu_offload` -> fsdp_cpu_offload.
    `state_dict_type`: what `save_fsdp_model`/`save_fsdp_optimizer` write (FULL_STATE_DICT: one file; SHARDED_STATE_DICT,
    Accelerate's FSDP2 default: a torch.distributed.checkpoint directory); acc's save_state writes shards either way. `cpu_ram_efficient_loading` or
    `sync_module_states` -> fsdp_from_rank0 (every process gets its shards of process 0's weights at prepare;
    the others may build on the meta device). `backward_prefetch`, `use_orig_params` and `limit_all_gathers` are FSDP1
    options: accepted with a warning that they have no effect.
    Not offered: `fsdp_version=1`, `forward_prefetch`, `activation_checkpointing`,
    `mixed_precision_policy` (acc's comes from mixed_precision), `ignored_modules`, `param_init_fn`,
    `state_dict_config`/`optim_state_dict_config`, NO_SHARD (use the ddp backend), custom wrap policies.
    """

    fsdp_version: int = None
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Any = None
    cpu_offload: Any = None
    ignored_modules: Any = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: Optional[bool] = None
    param_init_fn: Optional[Callable] = None
    sync_module_states: Optional[bool] = None
    forward_prefetch: bool = None
    activation_checkpointing: bool = None
    cpu_ram_efficient_loading: bool = None
    transformer_cls_names_to_wrap: Optional[list] = None
    min_num_params: Optional[int] = None

    @property
    def backend(self) -> str:
        """The acc backend this plugin configures."""
        return "fsdp"

    def to_settings(self) -> dict[str, object]:
        """The fsdp backend's settings these fields ask for (fields left at their defaults set nothing)."""
        from acc.compat.accelerate_launch import fsdp_settings

        no = _Refusals("FullyShardedDataParallelPlugin")
        given: dict[str, tuple[Any, str]] = {}

        def put(key: str, value: Any, name: str, shown: Any) -> None:
            given[key] = (value, f"FullyShardedDataParallelPlugin({name}={shown!r})")

        if self.fsdp_version is not None:
            if self.fsdp_version == 1:
                no.add("fsdp_version", 1, "acc's fsdp backend runs FSDP2 (torch's fully_shard), not FSDP1's "
                       "FullyShardedDataParallel wrapper: pass fsdp_version=2 (the other fields keep the meaning "
                       "Accelerate's FSDP2 gives them)")
            elif self.fsdp_version != 2:
                no.add("fsdp_version", self.fsdp_version, "FSDP versions are 1 and 2; acc runs 2")
        for name in ("sharding_strategy", "reshard_after_forward"):
            value = getattr(self, name)
            if value is not None:
                put(f"fsdp_{name}", _name(value), name, value)
        self._offload(no, put)
        self._wrap(no, put)
        for name, key in (("backward_prefetch", "fsdp_backward_prefetch"), ("use_orig_params", "fsdp_use_orig_params"),
                          ("sync_module_states", "fsdp_sync_module_states"), ("forward_prefetch",
                                                                              "fsdp_forward_prefetch"),
                          ("activation_checkpointing", "fsdp_activation_checkpointing"),
                          ("cpu_ram_efficient_loading", "fsdp_cpu_ram_efficient_loading"),
                          ("state_dict_type", "fsdp_state_dict_type"), ("ignored_modules", "fsdp_ignored_modules")):
            value = getattr(self, name)
            if value is not None:
                put(key, _name(value), name, value)
        if self.limit_all_gathers is not True:
            warnings.warn(f"FullyShardedDataParallelPlugin(limit_all_gathers={self.limit_all_gathers!r}) has no "
                          "effect: FSDP2, which acc's fsdp backend runs, has no such option", stacklevel=2)
        if self.mixed_precision_policy is not None:
            no.add("mixed_precision_policy", self.mixed_precision_policy, "acc's fsdp backend takes mixed precision from "
                   "mixed_precision (Accelerator(mixed_precision=\"bf16\") or --mixed-precision bf16: parameters "
                   "computed in bf16, gradients reduced in fp32); leave the policy unset")
        if self.param_init_fn is not None:
            no.add("param_init_fn", self.param_init_fn, "acc's fsdp backend shards the model as the script built it; "
                   "it does not materialise meta-device modules: build the model on a real device")
        for name in ("state_dict_config", "optim_state_dict_config"):
            if getattr(self, name) is not None:
                no.add(name, getattr(self, name), "acc's save_state writes each process's shard (loadable on any "
                       "number of processes) and save_model/get_state_dict gather the full weights on the main "
                       "process, on the CPU; leave it unset")
        no.raise_if_any()
        values, notes = fsdp_settings(given)  # raises AccError (ConfigError) naming the field for what it refuses
        for note in notes:
            warnings.warn(note, stacklevel=2)
        return {setting: value for setting, (value, _) in values.items()}

    def _offload(self, no: _Refusals, put: Callable) -> None:
        value = self.cpu_offload
        if value is None:
            return
        kind = type(value).__name__
        if isinstance(value, bool):
            put("fsdp_offload_params", value, "cpu_offload", value)
        elif kind == "CPUOffload":  # FSDP1's CPUOffload(offload_params=...)
            put("fsdp_offload_params", bool(getattr(value, "offload_params", False)), "cpu_offload", value)
        elif kind == "CPUOffloadPolicy":
            if getattr(value, "pin_memory", True) is not True:
                no.add("cpu_offload", value, "acc's fsdp_cpu_offload uses CPUOffloadPolicy() (pinned memory); pass "
                       "cpu_offload=True")
            else:
                put("fsdp_offload_params", True, "cpu_offload", value)
        elif kind == "OffloadPolicy":  # FSDP2's "no offload"
            put("fsdp_offload_params", False, "cpu_offload", value)
        else:
            no.add("cpu_offload", value, "give True/False, CPUOffload(offload_params=...) or CPUOffloadPolicy()")

    def _wrap(self, no: _Refusals, put: Callable) -> None:
        policy, classes, size = self.auto_wrap_policy, self.transformer_cls_names_to_wrap, self.min_num_params
        if policy is not None and not isinstance(policy, str):
            func = getattr(policy, "func", policy)  # functools.partial(transformer_auto_wrap_policy, ...)
            keywords = getattr(policy, "keywords", None) or {}
            name = getattr(func, "__name__", "")
            if name == "transformer_auto_wrap_policy":
                layer_classes = keywords.get("transformer_layer_cls")
                if layer_classes and classes is None:
                    classes = sorted(getattr(c, "__name__", str(c)) for c in layer_classes)
                policy = "TRANSFORMER_BASED_WRAP"
            elif name == "size_based_auto_wrap_policy":
                if "min_num_params" in keywords and size is None:
                    size = keywords["min_num_params"]
                policy = "SIZE_BASED_WRAP"
            else:
                no.add("auto_wrap_policy", self.auto_wrap_policy, "acc wraps by class name (auto_wrap_policy="
                       "\"transformer_based_wrap\" with transformer_cls_names_to_wrap) or by size (\"size_based_wrap\" "
                       "with min_num_params), not by a policy function of its own")
                return
        if policy is not None:
            put("fsdp_auto_wrap_policy", policy, "auto_wrap_policy", self.auto_wrap_policy)
            if str(policy).strip().upper() == "SIZE_BASED_WRAP" and not size:
                # Accelerate wraps nothing for min_num_params 0 (its default): only the root is sharded
                put("fsdp_auto_wrap_policy", "NO_WRAP", "auto_wrap_policy", self.auto_wrap_policy)
                size = None
        if classes is not None:
            names = classes.split(",") if isinstance(classes, str) else [getattr(c, "__name__", c) for c in classes]
            put("fsdp_transformer_layer_cls_to_wrap", ",".join(str(n).strip() for n in names),
                "transformer_cls_names_to_wrap", self.transformer_cls_names_to_wrap)
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                no.add("min_num_params", size, "give a number of parameters (an integer >= 0)")
            else:
                put("fsdp_min_num_params", size, "min_num_params", size)


# ---------------------------------------------------------------------------------------------- kwargs handlers


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """torch.compile for prepared models (Accelerate's fields). `backend` None: the launch's dynamo_backend
    setting (Accelerate reads its launcher's choice the same way); the other fields are torch.compile's arguments
    (None: torch's default). `to_kwargs()` gives the fields that were set, `backend` as torch's lower-case name.
    `use_regional_compilation=True` compiles the model's repeated blocks one by one, in place, on any backend (a
    model without repeated blocks is refused; see acc.runtime.compiling)."""

    backend: Any = None
    mode: Optional[str] = None
    fullgraph: Optional[bool] = None
    dynamic: Optional[bool] = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: Optional[bool] = None

    def __post_init__(self) -> None:
        # Accelerate's launcher hands its choice over in ACCELERATE_DYNAMO_* variables: a field left None takes
        # the variable's value when it is set (acc's own launcher sets none of them)
        env = {name: os.environ.get(f"ACCELERATE_DYNAMO_{name}") for name in
               ("BACKEND", "MODE", "USE_FULLGRAPH", "USE_DYNAMIC", "USE_REGIONAL_COMPILATION")}
        if self.backend is None and env["BACKEND"] is not None:
            self.backend = env["BACKEND"]
        if self.mode is None and env["MODE"] is not None:
            self.mode = env["MODE"]
        for field_name, key in (("fullgraph", "USE_FULLGRAPH"), ("dynamic", "USE_DYNAMIC"),
                                ("use_regional_compilation", "USE_REGIONAL_COMPILATION")):
            if getattr(self, field_name) is None and env[key] is not None:
                setattr(self, field_name, str_to_bool(env[key]) == 1)
        if self.backend is not None:
            self.backend = DynamoBackend(str(getattr(self.backend, "value", self.backend)).upper())

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if out["backend"] is not None:
            out["backend"] = out["backend"].value.lower()
        return out

    def to_kwargs(self) -> dict[str, Any]:
        """torch.compile's keyword arguments that differ from the defaults (use_regional_compilation is not one)."""
        with clear_environment():  # the defaults are the fields' own, whatever the variables say
            default = TorchDynamoPlugin().to_dict()
        mine = self.to_dict()
        mine.pop("use_regional_compilation")
        return {k: v for k, v in mine.items() if v != default[k]}


@dataclass
class ProfileKwargs(KwargsHandler):
    """torch.profiler settings for `accelerator.profile()` (Accelerate's fields). `activities`: names among "cpu",
    "cuda", "xpu", "mtia", "hpu"; `schedule_option`: torch.profiler.schedule's arguments (wait, warmup, active,
    repeat, skip_first); `output_trace_dir`: where each process's Chrome trace is written. `build()` makes the
    `torch.profiler.profile` (torch is imported only there)."""

    activities: Optional[list] = None
    schedule_option: Optional[dict] = None
    on_trace_ready: Optional[Callable] = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: Optional[str] = None

    def _get_profiler_activity(self, activity: str) -> Any:
        import torch

        kinds = torch.profiler.ProfilerActivity
        known = {"cpu": kinds.CPU, "cuda": kinds.CUDA}
        for name in ("xpu", "mtia", "hpu"):
            if hasattr(kinds, name.upper()):
                known[name] = getattr(kinds, name.upper())
        if activity not in known:
            raise ValueError(f"Invalid profiler activity: {activity}. Must be one of {list(known)}.")
        return known[activity]

    def build(self) -> Any:
        """A `torch.profiler.profile` configured from these fields."""
        import torch

        activities = None if self.activities is None else [self._get_profiler_activity(a) for a in self.activities]
        schedule = None if self.schedule_option is None else torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=self.on_trace_ready,
                                      record_shapes=self.record_shapes, profile_memory=self.profile_memory,
                                      with_stack=self.with_stack, with_flops=self.with_flops,
                                      with_modules=self.with_modules)


__all__ = ["DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "ProfileKwargs", "TorchDynamoPlugin"]
