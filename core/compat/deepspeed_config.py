"""Accelerate's `HfDeepSpeedConfig`: a DeepSpeed config (a dict, a JSON file, JSON text or URL-safe base64 JSON) that
can be asked for dotted keys ("zero_optimization.stage") and the ZeRO stage and offload it sets. transformers
subclasses it (its `HfTrainerDeepSpeedConfig` fills the "auto" values from `TrainingArguments`). Torch-free.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import os
from typing import Any


def _read(source: Any) -> dict[str, Any]:
    if isinstance(source, dict):
        return copy.deepcopy(source)  # the caller's dict stays as given (the "auto" values get filled in the copy)
    if isinstance(source, (str, os.PathLike)) and os.path.exists(source):
        with open(source, encoding="utf-8") as f:
            return json.load(f)
    if isinstance(source, str):
        for decode in (lambda s: s, lambda s: base64.urlsafe_b64decode(s).decode("utf-8")):
            try:
                found = json.loads(decode(source))
            except (ValueError, UnicodeDecodeError, binascii.Error):
                continue
            if isinstance(found, dict):
                return found
    raise ValueError("HfDeepSpeedConfig: expected a DeepSpeed config as a dict, the path of an existing JSON file, "
                     f"JSON text or base64-encoded JSON; got {source!r}")


class HfDeepSpeedConfig:
    """A DeepSpeed config dict (`.config`) and questions about it, as Accelerate asks them."""

    def __init__(self, config_file_or_dict: Any) -> None:
        self.config = _read(config_file_or_dict)
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Read the ZeRO stage (-1: none set) and whether stage 2/3 offloads to cpu or nvme."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        devices = {self.get_value("zero_optimization.offload_optimizer.device"),
                   self.get_value("zero_optimization.offload_param.device")}
        self._offload = (self.is_zero2() or self.is_zero3()) and bool(devices & {"cpu", "nvme"})

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """The dict holding the last part of the dotted key (None if a part above it is missing or not a dict), and
        that part."""
        *parents, key = ds_key_long.split(".")
        node: Any = self.config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        return (node, key) if isinstance(node, dict) else (None, key)

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        node, key = self.find_config_node(ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise ValueError(f"HfDeepSpeedConfig: no {ds_key_long!r} entry in the config {self.config}")
            return
        del node[key]

    def is_true(self, ds_key_long: str) -> bool:
        """True only when the key is set to a true value (unset: False)."""
        value = self.get_value(ds_key_long)
        return value is not None and bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """True only when the key is set to a false value (unset: False)."""
        value = self.get_value(ds_key_long)
        return value is not None and not bool(value)

    def is_zero2(self) -> bool:
        return self._stage == 2

    def is_zero3(self) -> bool:
        return self._stage == 3

    def is_offload(self) -> bool:
        return self._offload


__all__ = ["HfDeepSpeedConfig"]
