"""Accelerate's `accelerate.data_loader` names: acc's prepared loader and samplers (`acc.runtime.data`), and
Accelerate's loader classes for code that builds them directly (`acc.runtime.data.adapters`)."""

from __future__ import annotations

from acc.runtime.data.adapters import (
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    SkipBatchSampler,
    SkipDataLoader,
    prepare_data_loader,
)
from acc.runtime.data.loader import PreparedDataLoader, skip_first_batches
from acc.runtime.data.samplers import IterableShard, SeedableRandomSampler, ShardedBatchSampler

BatchSamplerShard = ShardedBatchSampler
IterableDatasetShard = IterableShard

__all__ = ["BatchSamplerShard", "DataLoaderDispatcher", "DataLoaderShard", "DataLoaderStateMixin",
           "IterableDatasetShard", "PreparedDataLoader", "SeedableRandomSampler", "SkipBatchSampler",
           "SkipDataLoader", "prepare_data_loader", "skip_first_batches"]
