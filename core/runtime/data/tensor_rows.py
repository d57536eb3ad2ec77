"""Whole-batch reads of an in-memory `TensorDataset`: one indexing op per tensor instead of one per sample.

torch's DataLoader reads a batch of a map-style dataset sample by sample (`dataset[i]` for each index, then
`default_collate` stacks them): for a TensorDataset that is 2 x batch-size indexing calls and a stack per tensor,
about 290 us of a 2.3 ms step for batch 32 on the bench's tiny MLP. `t[indices]` gives the same tensor (same
values, dtype, shape and row order) in one call. The prepared loader uses it only where it cannot change what the
user gets: a plain TensorDataset (not a subclass, whose `__getitem__` may differ), the default collate function, no
worker processes. The DataLoader itself is still torch's, so its RNG draws, pinning and sampler are unchanged.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.utils.data import TensorDataset, default_collate


class _Collated(list):  # type: ignore[type-arg]
    """A batch already in `default_collate`'s output form (a list with one tensor per dataset tensor)."""


class BatchedRows:
    """A TensorDataset's view whose `__getitems__` (the DataLoader's batched read) indexes each tensor once."""

    def __init__(self, dataset: TensorDataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> Any:
        if len(indices) == 0:  # what default_collate makes of no samples (its own error), as without this view
            return []
        rows = torch.as_tensor(indices, dtype=torch.long)
        return _Collated(t[rows] for t in self.dataset.tensors)  # read each time: the user may replace them


def collate(batch: Any) -> Any:
    """`default_collate`, except for a batch `BatchedRows` already collated."""
    return list(batch) if isinstance(batch, _Collated) else default_collate(batch)


def batched_rows(dataset: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(dataset, DataLoader kwargs) for the prepared loader's own DataLoader: a `BatchedRows` view and its collate
    where that reads the same batches faster, else both as given."""
    if type(dataset) is not TensorDataset or kwargs.get("collate_fn") is not default_collate \
            or kwargs.get("num_workers", 0) != 0:
        return dataset, kwargs
    return BatchedRows(dataset), {**kwargs, "collate_fn": collate}
