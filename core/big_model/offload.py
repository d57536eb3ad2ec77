"""Weights offloaded to disk, one file each: Accelerate's offload folder (`<name>.dat` holding the tensor's raw bytes,
`index.json` giving each one's dtype and shape), written and read with acc's `OffloadFolder` and `TensorRecord`
(`acc.big_model.files`), and the mapping that serves a model's weights from memory and such a folder together.
Accelerate's names for them are `acc.utils.offload`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from acc.big_model.files import OffloadFolder, TensorRecord

INDEX_FILE = "index.json"


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, str(name).replace("torch.", ""), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"offload index: dtype {name!r} is not a torch dtype")
    return value


def offload_weight(weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike,
                   index: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write `weight` to `offload_folder/<weight_name>.dat` and add its entry (dtype, shape) to `index` (a new
    dict when None), which is returned. The index file itself is written by `save_offload_index`."""
    folder = OffloadFolder(offload_folder)
    folder.write(weight_name, weight)
    index = {} if index is None else index
    index[weight_name] = folder.index[weight_name]
    return index


def load_offloaded_weight(weight_file: str | os.PathLike, weight_info: Mapping[str, Any]) -> torch.Tensor:
    """The tensor `offload_weight` wrote to `weight_file`, as its index entry (`weight_info`) describes it."""
    dtype, shape = _dtype(weight_info["dtype"]), tuple(weight_info["shape"])
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return TensorRecord(str(weight_file), 0, nbytes, dtype, shape).read()


def save_offload_index(index: Mapping[str, Any] | None, offload_folder: str | os.PathLike) -> None:
    """Merge `index` into `offload_folder/index.json` (entries already there are kept unless `index` has them)."""
    if not index:
        return
    path = Path(offload_folder) / INDEX_FILE
    current = json.loads(path.read_text()) if path.is_file() else {}
    current.update(index)
    path.write_text(json.dumps(current, indent=1) + "\n")


def load_offloaded_weights(model: torch.nn.Module, index: Mapping[str, Any] | None,
                           offload_folder: str | os.PathLike) -> None:
    """Load every weight of an offload folder's `index` into `model`, on the CPU, in place (a tensor on the meta
    device gets its data). An 8-bit weight's `SCB` statistics entry goes with its weight."""
    from acc.big_model.tensors import set_module_tensor_to_device

    for name, info in (index or {}).items():
        if "SCB" in name:
            continue
        statistics_name = name.replace("weight", "SCB")
        statistics = None
        if "weight" in name and statistics_name in index:  # type: ignore[operator]
            statistics = load_offloaded_weight(Path(offload_folder) / f"{statistics_name}.dat", index[statistics_name])
        weight = load_offloaded_weight(Path(offload_folder) / f"{name}.dat", info)
        set_module_tensor_to_device(model, name, "cpu", value=weight, fp16_statistics=statistics)


def offload_state_dict(save_dir: str | os.PathLike, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Write every tensor of `state_dict` into the offload folder `save_dir`, with its index."""
    index: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index)
    save_offload_index(index, save_dir)


class OffloadedWeightsLoader(Mapping):
    """A model's weights by name, from `state_dict` first, else from the offload folder `save_folder` (its
    `index.json` unless `index` is given; an entry naming a `safetensors_file` is read from that file), on
    `device` (the CPU by default). Nothing is read until a weight is asked for."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor] | None = None,
                 save_folder: str | os.PathLike | None = None, index: Mapping[str, Any] | None = None,
                 device: Any = None):
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index of offloaded "
                             "weights; got none of them")
        if index is None and save_folder is not None:
            index = json.loads((Path(save_folder) / INDEX_FILE).read_text())
        self.state_dict = dict(state_dict or {})
        self.save_folder = save_folder
        self.index = dict(index or {})
        self.device = device
        self.all_keys = list(self.state_dict) + [k for k in self.index if k not in self.state_dict]

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        device = torch.device("cpu" if self.device is None else self.device)
        if info.get("safetensors_file") is not None:
            from safetensors import safe_open

            with safe_open(info["safetensors_file"], framework="pt", device="cpu") as f:
                tensor = f.get_tensor(info.get("weight_name", key))
            if "dtype" in info:
                tensor = tensor.to(_dtype(info["dtype"]))
        else:
            if self.save_folder is None:
                raise KeyError(f"{key}: its index entry names no file and the loader has no save_folder")
            tensor = load_offloaded_weight(Path(self.save_folder) / f"{key}.dat", info)
        return tensor if tensor.device == device else tensor.to(device)

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


def extract_submodules_state_dict(state_dict: Mapping[str, Any], submodule_names: list[str]) -> dict[str, Any]:
    """The entries of `state_dict` that belong to one of `submodule_names` (the name itself, or below it:
    "a.1" takes "a.1.weight", never "a.10.weight")."""
    out = {}
    for name in submodule_names:
        out.update({key: value for key, value in state_dict.items() if key == name or key.startswith(name + ".")})
    return out


__all__ = ["OffloadedWeightsLoader", "extract_submodules_state_dict", "load_offloaded_weight", "offload_state_dict",
           "offload_weight", "save_offload_index"]
