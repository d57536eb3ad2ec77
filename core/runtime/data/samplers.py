"""How a data loader's batches are shared among processes: the samplers and dataset wrappers under `prepare`.

Default (`last_batch = "fill"`), the same batches as Hugging Face Accelerate 1.15 on every rank:

- map-style datasets: the original batches are dealt round-robin (batch i to process i % N), so one round of N
  batches is the global batch. With `even_batches`, the last round is completed to N full batches: a short
  last batch is filled up with samples from the start of the epoch, and processes left without a batch get
  whole batches of those samples. Without it, each process keeps what it was dealt. With `split_batches`, every
  batch is cut into N contiguous pieces instead (the last one filled up the same way).
- iterable datasets, when batches are not dispatched from the main process: every process reads the stream and
  keeps its slice of each chunk of N x batch_size samples (`IterableShard`).

`last_batch = "short"` (acc's own): the data's short last batch stays short and only processes left without any
batch get whole batches from the start of the epoch, so fewer samples are seen twice.

On one process nothing is dealt: the user's batch sampler runs as is (a short last batch stays short).
Every sampler here can skip the first batches of its next pass without loading them (resume).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator

import torch
from torch.utils.data import IterableDataset, RandomSampler

LAST_BATCH_MODES = ("fill", "short")


def shard_length(batches: int, processes: int, index: int, split: bool, drop_last: bool, even: bool) -> int:
    """How many batches process `index` of `processes` takes from an epoch of `batches` batches."""
    if split or processes == 1:
        return batches
    whole, extra = divmod(batches, processes)
    if not extra or drop_last:
        return whole
    if even:
        return whole + 1
    return whole + (1 if index < extra else 0)


class ShardedBatchSampler:
    """Deals the batches of `batch_sampler` to `num_processes` processes; yields process `process_index`'s.

    `skip` makes the next pass start after that many of this process's batches (their indices are drawn, their
    samples are not loaded).
    """

    def __init__(self, batch_sampler: Any, num_processes: int = 1, process_index: int = 0,
                 split_batches: bool = False, even_batches: bool = True, last_batch: str = "fill"):
        if last_batch not in LAST_BATCH_MODES:
            raise ValueError(f"last_batch {last_batch!r} is not one of {', '.join(LAST_BATCH_MODES)}")
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.last_batch = last_batch
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        self.skip = 0
        self.real_in_last_round = 0  # "short" mode: real samples of the last round dealt (for gather_for_metrics)
        self.padded_last_round = False
        if split_batches and num_processes > 1 and (self.batch_size is None or self.batch_size % num_processes):
            raise ValueError(
                f"split_batches=True needs a batch size that is a round multiple of the number of processes; got batch "
                f"size {self.batch_size} on {num_processes} processes (use a batch size that {num_processes} divides)"
            )

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    def __len__(self) -> int:
        total = shard_length(len(self.batch_sampler), self.num_processes, self.process_index, self.split_batches,
                             self.drop_last, self.even_batches)
        if self.split_batches and not self.even_batches and self.num_processes > 1 and total:
            last = self._last_batch_len()  # a short last batch reaches only the processes its samples cover
            if last is not None and last < self.batch_size and last <= self.batch_size // self.num_processes * \
                    self.process_index:
                total -= 1
        return total

    def _last_batch_len(self) -> int | None:
        try:
            samples = len(self.sampler)
        except TypeError:
            return None
        return samples - self.batch_size * (len(self.batch_sampler) - 1)

    def __iter__(self) -> Iterator[list]:
        # read when the pass starts, not when iter() is called: a DataLoader with workers calls iter() twice
        # and only advances the second iterator (the first one would take the skip with it)
        skip, self.skip = self.skip, 0
        self.padded_last_round, self.real_in_last_round = False, 0
        batches = self._batches()
        yield from (itertools.islice(batches, skip, None) if skip else batches)

    def _batches(self) -> Iterator[list]:
        if self.num_processes == 1:
            return (list(b) for b in self.batch_sampler)
        if self.split_batches:
            return self._split()
        if self.last_batch == "short":
            return self._deal_short()
        return self._deal_fill()

    # -- Accelerate's dealing: the last round filled to full size
    def _deal_fill(self) -> Iterator[list]:
        n, r, size = self.num_processes, self.process_index, self.batch_size
        pool: list = []  # the epoch's first samples (or first batches, when batch sizes vary)
        mine = None
        index, batch = -1, []
        for index, batch in enumerate(self.batch_sampler):
            batch = list(batch)
            if not self.drop_last and index < n:
                if size is None:
                    pool.append(batch)
                else:
                    pool.extend(batch)
            if index % n == r:
                mine = batch
            if index % n == n - 1 and (size is None or len(batch) == size):
                yield mine
                mine = None
        if self.drop_last or not pool:
            return
        if not self.even_batches:
            if mine:
                yield mine
            return
        if mine and (size is None or len(mine) == size):
            yield mine
        needed = n * size if size is not None else n
        while len(pool) < needed:
            pool = pool + pool
        if size is None or len(batch) == size:  # the last batch was complete: fill the round with new ones
            batch, index = [], index + 1
        taken = 0
        while index % n != 0 or batch:
            if size is None:
                batch = pool[taken]
                taken += 1
            else:
                end = taken + size - len(batch)
                batch = batch + pool[taken:end]
                taken = end
            if index % n == r:
                yield batch
            batch, index = [], index + 1

    def _split(self) -> Iterator[list]:
        n, r, size = self.num_processes, self.process_index, self.batch_size
        per = size // n
        first: list = []
        batch: list = []
        for index, batch in enumerate(self.batch_sampler):
            batch = list(batch)
            if index == 0:
                first = batch
            if len(batch) == size:
                yield batch[per * r : per * (r + 1)]
        if self.drop_last or not first or len(batch) >= size:
            return
        if not self.even_batches:
            if len(batch) > per * r:
                yield batch[per * r : per * (r + 1)]
            return
        if self.last_batch == "fill":
            while len(first) < size:
                first = first + first
            padded = batch + first
        else:
            padded = batch + list(itertools.islice(itertools.cycle(first), size - len(batch)))
        self.padded_last_round, self.real_in_last_round = True, len(batch)
        yield padded[per * r : per * (r + 1)]

    # -- acc's dealing: the short last batch stays short
    def _deal_short(self) -> Iterator[list]:
        n, r, size = self.num_processes, self.process_index, self.batch_size
        first: list = []
        round_: list[list] = []
        for batch in self.batch_sampler:
            batch = list(batch)
            size = size or len(batch)
            if len(first) < size * n:
                first.extend(batch[: size * n - len(first)])
            round_.append(batch)
            if len(round_) == n:
                yield round_[r]
                round_ = []
        if not round_ or self.drop_last:
            return
        if not self.even_batches:
            if r < len(round_):
                yield round_[r]
            return
        real = sum(len(b) for b in round_)
        cycle = itertools.cycle(first)
        while len(round_) < n:
            round_.append(list(itertools.islice(cycle, size)))
        self.padded_last_round, self.real_in_last_round = True, real
        yield round_[r]


class IterableShard(IterableDataset):
    """An iterable dataset read by every process, each keeping its slice of every chunk of N x batch_size
    samples (with `split_batches`, of every batch); the last chunk is completed with the first samples."""

    def __init__(self, dataset: Any, batch_size: int, drop_last: bool, num_processes: int, process_index: int,
                 split_batches: bool = False):
        if split_batches and batch_size > 1 and batch_size % num_processes:
            raise ValueError(f"split_batches=True needs a batch size that is a round multiple of {num_processes} processes; "
                             f"got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0
        self.real_in_last_round = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        chunk = self.batch_size * self.num_processes
        whole, extra = divmod(len(self.dataset), chunk)
        return (whole + (1 if extra and not self.drop_last else 0)) * self.batch_size

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not callable(getattr(self.dataset, "set_epoch", None)) and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)
        chunk = self.batch_size if self.split_batches else self.batch_size * self.num_processes
        per = self.batch_size // self.num_processes if self.split_batches else self.batch_size
        mine = range(self.process_index * per, (self.process_index + 1) * per)
        first: list | None = None
        current: list = []
        self.real_in_last_round = 0
        for sample in self.dataset:
            current.append(sample)
            if len(current) == chunk:
                yield from (current[i] for i in mine)
                first = first if first is not None else list(current)
                current = []
        if current and not self.drop_last:
            self.real_in_last_round = len(current)
            pool = first if first is not None else list(current)
            while len(current) < chunk:
                current = current + pool
            yield from (current[i] for i in mine)


class SeedableRandomSampler(RandomSampler):
    """A RandomSampler whose order depends only on a seed and the epoch: epoch e shuffles with `seed + e`.

    Every process draws the same permutation without exchanging anything, and a run on 1 process sees the
    same global batches as on N (`use_seedable_sampler`, Accelerate's name). The seed is `data_seed`, else
    torch's initial seed (what `set_seed` set).
    """

    def __init__(self, *args: Any, data_seed: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.epoch + self.initial_seed)
        # the order drawn at once (the same draws from the sampler's own generator), then handed out by C iterators:
        # a batch of B indices costs no Python frame per index; the epoch advances when the order is used up
        order = list(super().__iter__())
        return itertools.chain(order, self._advance_epoch())

    def _advance_epoch(self) -> Iterator[int]:
        self.set_epoch(self.epoch + 1)
        return
        yield  # a generator: runs when the order is used up

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
