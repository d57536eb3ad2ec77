"""The DeepSpeed configuration: the user's JSON (or nothing) completed from acc's settings.

Values the user left as "auto" (or left out) are filled from acc: micro batch size (from the prepared data
loader), gradient accumulation steps, mixed precision, world size, ZeRO stage and offload flags. A value the
user set that contradicts acc's is an error naming both; nothing is silently overridden. Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from acc.errors import ConfigError

AUTO = "auto"


def read_user_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"deepspeed_config {path} does not exist; give the path of a DeepSpeed JSON file")
    try:
        data = json.loads(file.read_text())
    except ValueError as exc:
        raise ConfigError(f"deepspeed_config {path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"deepspeed_config {path}: the top level must be a JSON object")
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
