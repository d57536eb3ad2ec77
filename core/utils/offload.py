"""Accelerate's `accelerate.utils.offload`: weights offloaded to disk one file each, and the mapping that serves a
model's weights from memory and such a folder (acc.big_model.offload; `PrefixedDataset` from acc.big_model)."""

from acc.big_model.module_hooks import PrefixedDataset
from acc.big_model.offload import (
    OffloadedWeightsLoader,
    extract_submodules_state_dict,
    load_offloaded_weight,
    load_offloaded_weights,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)

__all__ = ["OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict", "load_offloaded_weight",
           "load_offloaded_weights", "offload_state_dict", "offload_weight", "save_offload_index"]
