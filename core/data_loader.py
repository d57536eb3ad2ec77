"""Accelerate's `accelerate.data_loader` names, for scripts that import from that path: acc's prepared loader,
samplers and `skip_first_batches` (see acc.runtime.data.loader and acc.runtime.data.samplers for what they do)."""

from __future__ import annotations

from acc.runtime.data.loader import PreparedDataLoader, skip_first_batches
from acc.runtime.data.samplers import IterableShard, SeedableRandomSampler, ShardedBatchSampler

DataLoaderShard = PreparedDataLoader
DataLoaderDispatcher = PreparedDataLoader  # dispatching is a mode of the same loader (DataLoaderConfiguration)
BatchSamplerShard = ShardedBatchSampler
IterableDatasetShard = IterableShard

__all__ = ["BatchSamplerShard", "DataLoaderDispatcher", "DataLoaderShard", "IterableDatasetShard",
           "SeedableRandomSampler", "skip_first_batches"]
