"""Prepared data loaders: each process gets its own share of every epoch, on its device.

Map-style datasets are sharded at the batch sampler (each process loads only its samples): the
original batches are dealt round-robin, batch i to process i % N, so one round of N batches is the
global batch and gathering a round restores dataset order. Iterable datasets are sharded after
batching (every process reads the stream; each keeps its batches), as they cannot be indexed.

`even_batches` (default) completes the last round with whole batches of samples from the start of the
epoch, so every process takes the same number of steps (the data's short last batch stays short, as in a
plain DataLoader; with `split_batches` it is padded to full size so no process gets an empty share);
the loader records how many samples of that round are real, so
`gather_for_metrics` can drop the padding. Shuffling uses a generator reseeded with
`seed + epoch` at each epoch, with the seed agreed across processes, so all processes see the same
permutation (no `set_epoch` needed) and a run on 1 process sees the same global batches as on N.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from . import ops


def shard_length(batches: int, processes: int, index: int, split: bool, drop_last: bool, even: bool) -> int:
    """How many batches process `index` of `processes` takes from an epoch of `batches` batches."""
    if split:
        return batches
    if drop_last:
        return batches // processes
    if even:
        return math.ceil(batches / processes)
    return batches // processes + (1 if index < batches % processes else 0)


class ShardedBatchSampler:
    """Deals the batches of `batch_sampler` to `num_processes` processes; this one takes `process_index`'s."""

    def __init__(
        self,
        batch_sampler: Any,
        num_processes: int,
        process_index: int,
        split_batches: bool = False,
        even_batches: bool = True,
        drop_last: bool = False,
    ):
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.drop_last = drop_last
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        if split_batches and self.batch_size is not None and self.batch_size % num_processes:
            raise ValueError(
                f"split_batches=True needs a batch size divisible by the number of processes; "
                f"got batch size {self.batch_size} on {num_processes} processes"
            )
        # facts about the last epoch iterated, for gather_for_metrics
        self.padded_last_round = False
        self.real_in_last_round = 0

    def __len__(self) -> int:
        return shard_length(len(self.batch_sampler), self.num_processes, self.process_index, self.split_batches,
                            self.drop_last, self.even_batches)

    def _padding(self, first_indices: list, used: int, count: int) -> list:
        """`count` indices from the start of the epoch, continuing after the first `used` of them."""
        cycle = itertools.islice(itertools.cycle(first_indices), used, used + count)
        return list(cycle)

    def __iter__(self) -> Iterator[list]:
        self.padded_last_round = False
        self.real_in_last_round = 0
        w, r = self.num_processes, self.process_index
        first: list = []  # the first indices of the epoch, the pool padding is drawn from
        size = self.batch_size
        if self.split_batches:
            for batch in self.batch_sampler:
                batch = list(batch)
                size = size or len(batch)
                if len(first) < size:
                    first.extend(batch[: size - len(first)])
                real = len(batch)
                if real < size:
                    batch = batch + self._padding(first, 0, size - real)
                    self.padded_last_round, self.real_in_last_round = True, real
                per = size // w
                yield batch[r * per : (r + 1) * per]
            return
        round_: list[list] = []
        for batch in self.batch_sampler:
            batch = list(batch)
            size = size or len(batch)
            if len(first) < size * w:
                first.extend(batch[: size * w - len(first)])
            round_.append(batch)
            if len(round_) == w:
                yield round_[r]
                round_ = []
        if not round_ or self.drop_last:
            return
        real = sum(len(b) for b in round_)
        if not self.even_batches:
            if r < len(round_):
                yield round_[r]
            return
        used = 0  # the short last batch stays short, as in a plain DataLoader; missing batches are added
        while len(round_) < w:
            round_.append(self._padding(first, used, size))
            used += size
        self.padded_last_round, self.real_in_last_round = True, real
        yield round_[r]


class _IterableShard:
    """Batch-level sharding of a loader over an iterable dataset (every process reads the stream)."""

    def __init__(self, loader: DataLoader, num_processes: int, process_index: int, split_batches: bool,
                 even_batches: bool, drop_last: bool):
        self.loader = loader
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.drop_last = drop_last
        self.padded_last_round = False
        self.real_in_last_round = 0

    def __len__(self) -> int:  # TypeError when the stream has no length, as in torch
        return shard_length(len(self.loader), self.num_processes, self.process_index, self.split_batches,
                            self.drop_last, self.even_batches)

    def __iter__(self) -> Iterator[Any]:
        self.padded_last_round = False
        w, r = self.num_processes, self.process_index
        first = None
        size = self.loader.batch_size
        if self.split_batches:
            for batch in self.loader:
                first = batch if first is None else first
                size = size or ops.batch_size(batch)
                if size % w:
                    raise ValueError(f"split_batches=True needs a batch size divisible by {w} processes; got {size}")
                real = ops.batch_size(batch)
                if real < size:
                    batch = _pad_batch(batch, first, size)
                    self.padded_last_round, self.real_in_last_round = True, real
                per = size // w
                yield ops.slice_batch(batch, slice(r * per, (r + 1) * per))
            return
        round_: list = []
        for batch in self.loader:
            first = batch if first is None else first
            size = size or ops.batch_size(batch)
            round_.append(batch)
            if len(round_) == w:
                yield round_[r]
                round_ = []
        if not round_ or self.drop_last:
            return
        if not self.even_batches:
            if r < len(round_):
                yield round_[r]
            return
        real = sum(ops.batch_size(b) for b in round_)
        while len(round_) < w:
            round_.append(_pad_batch(ops.slice_batch(first, slice(0, 0)), first, size))
        self.padded_last_round, self.real_in_last_round = True, real
        yield round_[r]


def _pad_batch(batch: Any, pool: Any, size: int) -> Any:
    """`batch` extended to `size` samples with samples from `pool` (the epoch's first batch), cycled."""
    have = ops.batch_size(batch)
    parts = [batch]
    pool_size = ops.batch_size(pool)
    while have < size:
        take = min(pool_size, size - have)
        parts.append(ops.slice_batch(pool, slice(0, take)))
        have += take
    return ops.concatenate(parts) if len(parts) > 1 else batch


_LOADER_ARGS = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
    "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
)


def _loader_kwargs(loader: DataLoader) -> dict[str, Any]:
    import inspect

    accepted = inspect.signature(DataLoader.__init__).parameters
    kwargs = {}
    for name in _LOADER_ARGS:
        if name in accepted and hasattr(loader, name):
            value = getattr(loader, name)
            if name == "prefetch_factor" and loader.num_workers == 0:
                continue
            kwargs[name] = value
    return kwargs


class PreparedDataLoader:
    """What `Accelerator.prepare` returns for a DataLoader.

    Iterating yields this process's batches on `device`. While the last batch of an epoch is out,
    `end_of_dataloader` is True and `padded_last_round` / `real_in_last_round` describe that round.
    """

    def __init__(
        self,
        loader: DataLoader,
        *,
        num_processes: int,
        process_index: int,
        device: Any,
        seed: int,
        split_batches: bool = False,
        even_batches: bool = True,
        on_start: Callable[["PreparedDataLoader"], None] | None = None,
        on_end: Callable[["PreparedDataLoader"], None] | None = None,
    ):
        self.base_loader = loader
        self.device = device
        self.seed = seed
        self.epoch = 0
        self.end_of_dataloader = False
        self.batches_yielded = 0
        self._skip = 0
        self._iterating = False
        self._interrupted: tuple[int, int] | None = None
        self._generation = 0  # which iteration owns the position (an abandoned one must not change it)
        self._on_start, self._on_end = on_start, on_end
        self.num_processes = num_processes
        self.dataset = loader.dataset
        self.generator = torch.Generator()
        self.worker_generator = torch.Generator()
        drop_last = bool(getattr(loader, "drop_last", False))
        if isinstance(loader.dataset, IterableDataset):
            self._shard: Any = _IterableShard(loader, num_processes, process_index, split_batches, even_batches,
                                              drop_last)
            self._loader: Any = self._shard
            self.total_batch_size = (loader.batch_size or 1) * (1 if split_batches else num_processes)
            self.per_process_batch_size = (loader.batch_size or 1) // (num_processes if split_batches else 1)
            return
        batch_sampler = loader.batch_sampler
        if batch_sampler is None:  # batch_size=None: the dataset yields ready batches
            raise ValueError("prepare() needs a DataLoader with a batch_size or batch_sampler (got batch_size=None)")
        sampler = getattr(batch_sampler, "sampler", None)
        if isinstance(sampler, RandomSampler) and type(batch_sampler) is BatchSampler:
            # replace the user's sampler by one driven by our per-epoch generator
            sampler = RandomSampler(
                sampler.data_source, replacement=sampler.replacement,
                num_samples=sampler._num_samples, generator=self.generator,
            )
            batch_sampler = BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
        self._shard = ShardedBatchSampler(
            batch_sampler, num_processes, process_index, split_batches, even_batches, drop_last
        )
        # the loader draws its workers' base seed from this generator, not from torch's global one: iterating
        # never shifts the user's random stream, and a resumed run draws the same worker seeds
        self._loader = DataLoader(loader.dataset, batch_sampler=self._shard, generator=self.worker_generator,
                                  **_loader_kwargs(loader))
        per = getattr(batch_sampler, "batch_size", None) or loader.batch_size or 1
        self.total_batch_size = per if split_batches else per * num_processes
        self.per_process_batch_size = per // num_processes if split_batches else per

    # -- state the kernel reads
    @property
    def padded_last_round(self) -> bool:
        return self._shard.padded_last_round

    @property
    def real_in_last_round(self) -> int:
        return self._shard.real_in_last_round

    @property
    def batch_size(self) -> int | None:
        return self.base_loader.batch_size

    def __len__(self) -> int:
        return len(self._loader)

    def position(self) -> tuple[int, int]:
        """(epoch, batches to skip) at which the data stream continues, for checkpoints.

        Mid-iteration, or after a loop left early (`break`), that is the current epoch after the
        batches already taken, so a resumed run continues exactly where this one stopped. (A new
        `for` loop in the same process starts the next epoch, as a plain DataLoader starts afresh.)
        """
        if self._iterating:
            return self.epoch, self.batches_yielded
        if self._interrupted is not None:
            return self._interrupted
        return self.epoch, self._skip

    def feed_through(self, wrap: Callable[[Any], Any]) -> None:
        """Let a backend move batches itself: `wrap(source)` replaces this loader's (sharded, CPU) batch source
        underneath its bookkeeping, and the kernel stops moving batches to the device (e.g. XLA's parallel
        loader uploads them ahead in a background thread)."""
        self._loader = wrap(self._loader)
        self.device = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration produces (optional: epochs count themselves)."""
        self.epoch = epoch
        self._interrupted = None
        self._generation += 1  # an iteration still open from before must not move the epoch on

    def skip_first_batches(self, count: int) -> None:
        """Make the next iteration start after `count` batches of its epoch (used when resuming)."""
        self._skip = count
        self._interrupted = None
        self._generation += 1

    def _start_epoch(self) -> None:
        self.generator.manual_seed(self.seed + self.epoch)
        self.worker_generator.manual_seed((self.seed + self.epoch + 0x5EED) % 2**63)
        for obj in (getattr(self.base_loader, "sampler", None), getattr(self.base_loader, "batch_sampler", None),
                    self.dataset):
            set_epoch = getattr(obj, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)

    def __iter__(self) -> Iterator[Any]:
        self._generation += 1
        generation = self._generation
        self._start_epoch()
        self.end_of_dataloader = False
        skip, self._skip = self._skip, 0
        self.batches_yielded = skip
        it = iter(self._loader)
        for _ in range(skip):
            next(it, None)
        if self._on_start:
            self._on_start(self)
        self._iterating, self._interrupted, completed = True, None, False
        try:
            try:
                current = next(it)
            except StopIteration:
                self.end_of_dataloader = completed = True
                return
            while True:
                try:
                    upcoming = next(it)
                except StopIteration:
                    self.end_of_dataloader = True
                    self.batches_yielded += 1
                    yield self._place(current)
                    completed = True
                    break
                self.batches_yielded += 1
                yield self._place(current)
                current = upcoming
        finally:
            if generation == self._generation:
                self._iterating = False
                if not completed:
                    self._interrupted = (self.epoch, self.batches_yielded)
                self.epoch += 1  # the next iteration is the next epoch, even after an early break
            if self._on_end:
                self._on_end(self)

    def _place(self, batch: Any) -> Any:
        """`batch` on this loader's device (a DataLoader's batches are CPU tensors: nothing to do for the CPU)."""
        device = self.device
        if device is None or (isinstance(device, torch.device) and device.type == "cpu"):
            return batch
        return ops.send_to_device(batch, device, non_blocking=bool(getattr(self.base_loader, "pin_memory", False)))
