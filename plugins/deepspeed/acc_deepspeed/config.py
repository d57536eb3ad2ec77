"""The DeepSpeed configuration: the user's JSON (or nothing) completed from acc's settings.

Values the user left as "auto" (or left out) are filled from acc: micro batch size (from the prepared data
loader), gradient accumulation steps, mixed precision, world size, ZeRO stage and offload flags; the "auto"
values of the config's "optimizer" and "scheduler" come from the script's DummyOptim/DummyScheduler
(`fill_optimizer_and_scheduler`). A value the user set that contradicts acc's is an error naming both; nothing
is silently overridden. Torch-free.

The `deepspeed_config` setting is a JSON file's path or, when it starts with "{", the JSON object itself (what
`DeepSpeedPlugin(hf_ds_config={...}).to_settings()` gives for a config written in code).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from acc import backend as sdk

AUTO = "auto"
IN_CODE = "the DeepSpeed config given in code"


def is_inline(value: str | None) -> bool:
    """True when the deepspeed_config setting holds the JSON object itself rather than a file's path."""
    return bool(value) and value.lstrip().startswith("{")


def describe(value: str | None) -> str:
    """How messages name the config: its path, 'the DeepSpeed config given in code', or the settings."""
    if not value:
        return "the DeepSpeed settings"
    return IN_CODE if is_inline(value) else value


def read_user_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    if is_inline(path):
        try:
            data = json.loads(path)
        except ValueError as exc:
            raise sdk.ConfigError(f"deepspeed_config ({IN_CODE}): not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise sdk.ConfigError(f"deepspeed_config ({IN_CODE}): the top level must be a JSON object")
        return data
    file = Path(path)
    if not file.is_file():
        raise sdk.ConfigError(f"deepspeed_config {path} does not exist; give the path of a DeepSpeed JSON file")
    try:
        data = json.loads(file.read_text())
    except ValueError as exc:
        raise sdk.ConfigError(f"deepspeed_config {path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise sdk.ConfigError(f"deepspeed_config {path}: the top level must be a JSON object")
    return data


def _agree(problems: list[str], where: str, key: str, theirs: Any, ours: Any, ours_from: str) -> Any:
    """Our value when theirs is absent or "auto"; theirs when equal; else a problem naming both."""
    if theirs is None or theirs == AUTO:
        return ours
    if ours is not None and theirs != ours:
        problems.append(f"{where} sets {key} = {theirs!r}, but acc's is {ours!r} ({ours_from}); make them agree "
                        f"(or write \"auto\" in the DeepSpeed config to take acc's)")
    return theirs


def complete(user: Mapping[str, Any], settings: Mapping[str, Any], world_size: int | None,
             micro_batch: int | None, where: str = "the DeepSpeed config") -> tuple[dict[str, Any], list[str]]:
    """(the full config, problems). `micro_batch`/`world_size` None: not known yet (launcher side)."""
    problems: list[str] = []
    source = getattr(settings, "source", lambda name: "default")
    config = json.loads(json.dumps(user))  # a deep copy
    accum = settings["gradient_accumulation_steps"]
    config["gradient_accumulation_steps"] = _agree(
        problems, where, "gradient_accumulation_steps", user.get("gradient_accumulation_steps"), accum,
        f"gradient_accumulation_steps from {source('gradient_accumulation_steps')}")
    micro = _agree(problems, where, "train_micro_batch_size_per_gpu", user.get("train_micro_batch_size_per_gpu"),
                   micro_batch, "the prepared DataLoader's batch size")
    if micro is not None:
        config["train_micro_batch_size_per_gpu"] = micro
    if micro is not None and world_size is not None and not isinstance(micro, str):
        config["train_batch_size"] = _agree(problems, where, "train_batch_size", user.get("train_batch_size"),
                                            micro * config["gradient_accumulation_steps"] * world_size,
                                            "micro batch x accumulation x processes")
    elif user.get("train_batch_size") == AUTO:
        config.pop("train_batch_size")
    mode = settings["mixed_precision"]
    for key, wanted in (("fp16", mode == "fp16"), ("bf16", mode == "bf16")):
        section = dict(user.get(key) or {})
        enabled = section.get("enabled", AUTO if key in user else None)
        if enabled in (None, AUTO):
            if wanted:
                section["enabled"] = True
                config[key] = section
            elif key in config:
                config[key] = {**section, "enabled": False}
        elif bool(enabled) != wanted:
            problems.append(f"{where} sets {key}.enabled = {enabled!r}, but acc's mixed_precision is {mode!r} "
                            f"(from {source('mixed_precision')}); make them agree")
    zero = dict(user.get("zero_optimization") or {})
    flag_stage = settings.get("zero_stage")
    stage = _agree(problems, where, "zero_optimization.stage", zero.get("stage"), flag_stage,
                   f"zero_stage from {source('zero_stage')}") if flag_stage is not None else zero.get("stage", 2)
    if stage == AUTO:
        stage = 2
    if stage not in (0, 1, 2, 3):
        problems.append(f"ZeRO stage {stage!r} is not one of 0, 1, 2, 3")
    zero["stage"] = stage
    for key, setting in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")):
        wanted = settings.get(setting)
        if wanted in (None, "none"):
            continue
        current = (zero.get(key) or {}).get("device")
        _agree(problems, where, f"zero_optimization.{key}.device", current, wanted, f"{setting} from {source(setting)}")
        zero[key] = {**(zero.get(key) or {}), "device": wanted}
    if zero.get("offload_param") and stage != 3:
        problems.append(f"offloading parameters needs ZeRO stage 3, but the stage is {stage}")
    config["zero_optimization"] = zero
    clip = settings.get("gradient_clipping")
    config["gradient_clipping"] = _agree(problems, where, "gradient_clipping", user.get("gradient_clipping"),
                                         clip, f"gradient_clipping from {source('gradient_clipping')}")
    if config["gradient_clipping"] in (None, AUTO):
        # DeepSpeed's own default clips at 1.0; acc clips only when asked, on every backend alike
        config["gradient_clipping"] = 0.0
    config.setdefault("zero_allow_untested_optimizer", True)  # the user's own optimizer is the point of prepare()
    config.setdefault("steps_per_print", 10**9)  # DeepSpeed's own progress lines off; acc's logging is the user's
    return config, problems


# ------------------------------------------------------------------ buckets sized from the model

BUCKET_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
# ZeRO-3 sizes only `model` fills (Accelerate has no "auto" for them); measured on the bench model (bench/sharded.py)
MODEL_KEYS = ("sub_group_size", "stage3_max_live_parameters", "stage3_max_reuse_distance")
ZERO_BUCKETS = ("auto", "deepspeed", "model")


def hidden_size(config_hidden: Any, parameter_shapes: list[tuple[int, ...]]) -> int | None:
    """The model's hidden size: `model.config.hidden_size` (or the largest of `hidden_sizes`), as Accelerate reads
    it; for a model without one, the larger side of its largest 2-D parameter (a hidden x hidden weight)."""
    if isinstance(config_hidden, (list, tuple)) and config_hidden:
        return int(max(config_hidden))
    if isinstance(config_hidden, int) and config_hidden > 0:
        return config_hidden
    matrices = [shape for shape in parameter_shapes if len(shape) == 2]
    if not matrices:
        return None
    largest = max(matrices, key=lambda shape: shape[0] * shape[1])
    return int(max(largest))


def bucket_sizes(hidden: int) -> dict[str, int]:
    """ZeRO's sizes, in elements, from the hidden size h. Accelerate's formulas for "auto": reduce bucket h^2, ZeRO-3
    prefetch bucket 0.9 h^2, persistence threshold 10 h. And acc's, for `zero_buckets` = model: optimizer sub-groups
    of h^2 / 4 elements per process (the optimizer steps one sub-group at a time, and a step's temporaries, about
    three times a sub-group, were 200 MB per process on the bench model with DeepSpeed's 1e9); at most 2 h^2
    parameters gathered at once, and a gathered parameter kept only when it is used again within h^2 elements
    (DeepSpeed's 1e9 for both held the bench model's whole 50M parameters gathered from forward to backward)."""
    square = hidden * hidden
    return {"reduce_bucket_size": square, "stage3_prefetch_bucket_size": int(0.9 * square),
            "stage3_param_persistence_threshold": 10 * hidden, "sub_group_size": max(1, square // 4),
            "stage3_max_live_parameters": 2 * square, "stage3_max_reuse_distance": square}


def fill_buckets(config: dict[str, Any], hidden: int | None, sizing: str, where: str, cpu: bool = False) -> list[str]:
    """Fill, in place, ZeRO's sizes from the hidden size (`bucket_sizes`): every one left "auto", and with
    `zero_buckets` = model every one the config leaves out too (DeepSpeed's own defaults, 5e8, 5e7 and 1e5 elements
    for the buckets and 1e9 for the rest, are sized for billion-parameter models). With `model` on the CPU (`cpu`) a
    prefetch bucket left out is 0: there the prefetched all-gather overlapped nothing (the step was no faster) and
    held the next layer's parameters gathered early (peak 0.65 -> 0.63 x ddp on the bench model). `zero_buckets` =
    auto (the default) is model when the hidden size is known, else deepspeed. A value "auto" in the config stays
    Accelerate's formula. Returns the problems."""
    if sizing == "auto":  # model where the hidden size is known, DeepSpeed's own sizes where it is not
        sizing = "model" if hidden is not None else "deepspeed"
    zero = config.setdefault("zero_optimization", {})
    keys = (*BUCKET_KEYS, *MODEL_KEYS) if zero.get("stage") == 3 else BUCKET_KEYS[:1]  # the rest is ZeRO-3's
    wanted = [k for k in (*BUCKET_KEYS, *MODEL_KEYS)
              if zero.get(k) == AUTO or (sizing == "model" and k in keys and k not in zero)]
    if not wanted:
        return []
    if hidden is None:
        return [f"{where}: {', '.join(f'zero_optimization.{k}' for k in wanted)} need the model's hidden size, and "
                "the model has neither config.hidden_size nor a 2-D parameter; give the values as integers"]
    values = bucket_sizes(hidden)
    if cpu and sizing == "model" and "stage3_prefetch_bucket_size" not in zero:
        values["stage3_prefetch_bucket_size"] = 0
    for key in wanted:
        zero[key] = values[key]
    return []


# ------------------------------------------------------------------ the config's optimizer and scheduler


def fill_optimizer_and_scheduler(config: dict[str, Any], optimizer: Any, scheduler: Any, num_processes: int,
                                 split_batches: bool, where: str) -> list[str]:
    """Fill, in place, the "auto" values of the config's "optimizer" and "scheduler" params as Accelerate does:
    from the DummyOptim (lr, weight_decay, its other keyword arguments) and the DummyScheduler made for the
    optimizer (warmup_min_lr 0, warmup_max_lr the optimizer's lr, warmup_num_steps, total_num_steps divided by
    the processes unless batches are split, its other keyword arguments). Returns the problems: a placeholder
    without its config section, a real optimizer beside a config one, "auto" values nothing gives."""

    problems: list[str] = []
    dummy = isinstance(optimizer, sdk.DummyOptim)
    if dummy and "optimizer" not in config:
        problems.append(f"DummyOptim stands for the optimizer a DeepSpeed config defines, but {where} has no "
                        "\"optimizer\" section: add one (e.g. \"optimizer\": {\"type\": \"AdamW\", \"params\": "
                        "{\"lr\": \"auto\", \"weight_decay\": \"auto\"}}) or pass a real torch optimizer")
    if not dummy and "optimizer" in config:
        problems.append(f"{where} defines an optimizer ({_type(config['optimizer'])}) and the script passes its own "
                        f"({type(optimizer).__name__}): remove the config's \"optimizer\" section, or pass "
                        "acc.utils.DummyOptim(model.parameters(), lr=...) to train with the config's")
    if scheduler is not None and scheduler.lr_scheduler_callable is None and "scheduler" not in config:
        problems.append(f"DummyScheduler stands for the scheduler a DeepSpeed config defines, but {where} has no "
                        "\"scheduler\" section: add one (e.g. \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
                        "{\"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\"}}), or build it in code with "
                        "DummyScheduler(optimizer, lr_scheduler_callable=lambda opt: ...)")
    if scheduler is None and "scheduler" in config and "initial_lr" in _first_group(optimizer):
        problems.append(f"{where} defines a scheduler ({_type(config['scheduler'])}) and the script built a torch LR "
                        "scheduler on its optimizer: remove the config's \"scheduler\" section, or replace the torch "
                        "scheduler with acc.utils.DummyScheduler(optimizer, ...) to use the config's")
    if problems:
        return problems
    if dummy:
        given = {"lr": optimizer.lr, "weight_decay": optimizer.weight_decay, **optimizer.kwargs}
        _fill(config["optimizer"], given, "optimizer", where, "DummyOptim", problems)
    if "scheduler" in config and (scheduler is None or scheduler.lr_scheduler_callable is None):
        given = {}
        if scheduler is not None:
            owner = scheduler.optimizer
            defaults = getattr(owner, "defaults", None)
            max_lr = getattr(owner, "lr", None) if defaults is None else defaults.get("lr")
            given = {"warmup_min_lr": 0, "warmup_max_lr": max_lr, "warmup_num_steps": scheduler.warmup_num_steps,
                     **scheduler.kwargs}
            if scheduler.total_num_steps is not None:
                total = scheduler.total_num_steps
                given["total_num_steps"] = total if split_batches else math.ceil(total / num_processes)
        _fill(config["scheduler"], given, "scheduler", where,
              "DummyScheduler" if scheduler is not None else "a DummyScheduler(optimizer, ...) made before prepare",
              problems)
    return problems


def _type(section: Any) -> str:
    return str(section.get("type", "no type")) if isinstance(section, dict) else repr(section)


def _first_group(optimizer: Any) -> dict:
    groups = getattr(optimizer, "param_groups", None)
    return groups[0] if groups else {}


def _fill(section: Any, given: Mapping[str, Any], name: str, where: str, source: str, problems: list[str]) -> None:
    params = section.get("params") if isinstance(section, dict) else None
    if not isinstance(params, dict):
        return
    for key, value in params.items():
        if value != AUTO:
            continue
        if given.get(key) is None:
            problems.append(f"{where} sets {name}.params.{key} = \"auto\", but nothing gives it: write a value in "
                            f"the config, or pass {key}=... to {source}")
        else:
            params[key] = given[key]
