"""Accelerate's data-loader classes, for scripts and tests that build them directly: `DataLoaderShard` and
`DataLoaderDispatcher` (torch DataLoaders that put batches on a device, know when a pass ends and take part in
gradient accumulation), `SkipDataLoader` and `SkipBatchSampler` (the first batches of every pass skipped),
`DataLoaderStateMixin`, and the function `prepare_data_loader`, which prepares a loader without an Accelerator.

What `Accelerator.prepare` returns is acc's own `PreparedDataLoader` (`acc.runtime.data.loader`); these classes
follow Accelerate's constructors (a DataLoader's arguments plus Accelerate's) and share acc's machinery: the
samplers of `acc.runtime.data.samplers`, `acc.runtime.ops` for device placement and slicing, the run's loop state
for `end_of_dataloader` and accumulation. The public path is `acc.data_loader`.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader

from acc.runtime import ops
from acc.runtime.data.loader import DataSettings, PreparedDataLoader, synchronize_rng_states

_END = object()


def _run() -> Any:
    from acc.runtime.worker import current

    return current()


class DataLoaderStateMixin:
    """`end_of_dataloader` (the last batch of the pass is out) and `remainder` (real samples in the last global
    batch, -1 when unknown) of a loader's current pass; while it iterates it is the run's active data loader, so
    `accumulate` syncs gradients at the end of the data."""

    end_of_dataloader: bool = False
    remainder: int = -1

    def reset(self) -> None:
        self.end_of_dataloader, self.remainder = False, -1

    def begin(self) -> None:
        self.reset()
        run = _run()
        if run is not None:
            run.ctx.loop.active_loaders.append(self)

    def end(self) -> None:
        run = _run()
        if run is not None and self in run.ctx.loop.active_loaders:
            run.ctx.loop.active_loaders.remove(self)


def _broadcast(obj: Any, src: int) -> Any:
    run = _run()
    return run.broadcast_object(obj, src) if run is not None and run.num_processes > 1 else obj


class DataLoaderShard(DataLoaderStateMixin, DataLoader):
    """A DataLoader (same arguments) whose batches go to `device`, with the RNGs of `rng_types` synchronised from
    the main process at each pass (`synchronized_generator`: the sampler's generator), the first `skip_batches`
    batches skipped, and `end_of_dataloader` set while the last batch is out. It shards nothing itself: the
    sampler it is given does (`BatchSamplerShard`)."""

    def __init__(self, dataset: Any, device: Any = None, rng_types: list | None = None,
                 synchronized_generator: torch.Generator | None = None, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, _drop_last: bool = False, _non_blocking: bool = False,
                 torch_device_mesh: Any = None, **kwargs: Any):
        DataLoader.__init__(self, dataset, **kwargs)
        self.device = device
        self.rng_types = rng_types
        self.synchronized_generator = synchronized_generator
        self.skip_batches = skip_batches
        self.use_stateful_dataloader = use_stateful_dataloader
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.iteration = 0
        self.base_dataloader = self  # Accelerate's adapter wraps a DataLoader; this one is the DataLoader itself

    def _batches(self) -> Iterator[Any]:
        return DataLoader.__iter__(self)

    def __iter__(self) -> Iterator[Any]:
        if self.rng_types is not None:
            synchronize_rng_states(self.rng_types, self.synchronized_generator, _broadcast)
        self.begin()
        self.set_epoch(self.iteration)
        it = self._batches()
        try:
            for _ in range(self.skip_batches):
                if next(it, _END) is _END:
                    return
            current = next(it, _END)
            while current is not _END:
                upcoming = next(it, _END)
                if upcoming is _END:
                    self.end_of_dataloader = True
                yield self._place(current)
                current = upcoming
            self.iteration += 1
        finally:
            self.end()

    def _place(self, batch: Any) -> Any:
        return batch if self.device is None else ops.send_to_device(batch, self.device, non_blocking=self._non_blocking)

    def set_epoch(self, epoch: int) -> None:
        """The pass number, handed on to the samplers and the dataset that take one (`set_epoch`)."""
        if self.iteration != epoch:
            self.iteration = epoch
        for holder in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None), self.sampler, self.dataset):
            if holder is not None and callable(getattr(holder, "set_epoch", None)):
                holder.set_epoch(epoch)

    def _kwargs(self) -> dict[str, Any]:
        from acc.runtime.data.loader import _loader_kwargs

        kwargs = _loader_kwargs(self)
        if isinstance(self.sampler, BatchSampler):
            kwargs.update(sampler=self.sampler, batch_size=None)
        else:
            kwargs.update(batch_sampler=self.batch_sampler)
        return kwargs

    def skip_first_batches(self, num_batches: int) -> "DataLoaderShard":
        """The same loader (its samplers shared) skipping the first `num_batches` batches, at the same pass."""
        copy = type(self)(self.dataset, device=self.device, rng_types=self.rng_types,
                          synchronized_generator=self.synchronized_generator, skip_batches=num_batches,
                          use_stateful_dataloader=self.use_stateful_dataloader, _drop_last=self._drop_last,
                          _non_blocking=self._non_blocking, **self._kwargs())
        copy.iteration = self.iteration
        return copy

    @property
    def total_batch_size(self) -> int:
        sampler = self.batch_sampler
        size = getattr(sampler, "batch_size", None) or self.batch_size or 1
        processes = getattr(sampler, "num_processes", 1)
        return size if getattr(sampler, "split_batches", False) else size * processes

    @property
    def total_dataset_length(self) -> int:
        return len(self.dataset)


class DataLoaderDispatcher(DataLoaderShard):
    """A DataLoaderShard whose data is read by the main process only: each step it takes a batch per process
    (one with `split_batches`), and every process gets its contiguous slice (the same batch when it runs alone)."""

    def __init__(self, dataset: Any, split_batches: bool = False, skip_batches: int = 0, _drop_last: bool = False,
                 _non_blocking: bool = False, slice_fn: Any = None, **kwargs: Any):
        super().__init__(dataset, skip_batches=skip_batches, _drop_last=_drop_last, _non_blocking=_non_blocking,
                         **kwargs)
        self.split_batches = split_batches
        self.slice_fn = slice_fn or ops.slice_batch

    def _batches(self) -> Iterator[Any]:
        run = _run()
        processes, index = (run.num_processes, run.process_index) if run is not None else (1, 0)
        if processes == 1:
            yield from DataLoader.__iter__(self)
            return
        it = DataLoader.__iter__(self) if index == 0 else None
        take = 1 if self.split_batches else processes
        while True:
            batches = []
            if index == 0:
                for _ in range(take):
                    batch = next(it, _END)  # type: ignore[arg-type]
                    if batch is _END:
                        break
                    batches.append(batch)
            payload = _broadcast((ops.concatenate(batches) if len(batches) > 1 else batches[0]) if batches else None, 0)
            if payload is None:
                return
            per = max(1, ops.batch_size(payload) // processes)
            yield self.slice_fn(payload, slice(index * per, (index + 1) * per))

    def skip_first_batches(self, num_batches: int) -> "DataLoaderDispatcher":
        copy = type(self)(self.dataset, split_batches=self.split_batches, skip_batches=num_batches,
                          _drop_last=self._drop_last, _non_blocking=self._non_blocking, device=self.device,
                          rng_types=self.rng_types, synchronized_generator=self.synchronized_generator,
                          **self._kwargs())
        copy.iteration = self.iteration
        return copy


class SkipBatchSampler(BatchSampler):
    """`batch_sampler` without its first `skip_batches` batches (on every pass)."""

    def __init__(self, batch_sampler: Any, skip_batches: int = 0):
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def batch_size(self) -> Any:
        return getattr(self.batch_sampler, "batch_size", None)

    @property
    def drop_last(self) -> Any:
        return getattr(self.batch_sampler, "drop_last", False)

    def __iter__(self) -> Iterator[list]:
        for i, batch in enumerate(self.batch_sampler):
            if i >= self.skip_batches:
                yield batch

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip_batches)


class SkipDataLoader(DataLoaderStateMixin, DataLoader):
    """A DataLoader (same arguments) that skips the first `skip_batches` batches of every pass."""

    def __init__(self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs: Any):
        DataLoader.__init__(self, dataset, **kwargs)
        self.skip_batches = skip_batches
        self.use_stateful_dataloader = use_stateful_dataloader
        self.base_dataloader = self

    def __iter__(self) -> Iterator[Any]:
        self.begin()
        try:
            for i, batch in enumerate(DataLoader.__iter__(self)):
                if i >= self.skip_batches:
                    yield batch
        finally:
            self.end()


def prepare_data_loader(dataloader: DataLoader, device: Any = None, num_processes: int | None = None,
                        process_index: int | None = None, split_batches: bool = False, put_on_device: bool = False,
                        rng_types: list | None = None, dispatch_batches: bool | None = None,
                        even_batches: bool = True, slice_fn_for_dispatch: Any = None,
                        use_seedable_sampler: bool = False, data_seed: int | None = None,
                        non_blocking: bool = False, use_stateful_dataloader: bool = False,
                        torch_device_mesh: Any = None) -> PreparedDataLoader:
    """Prepare `dataloader` without an Accelerator: this process's share of every pass (`process_index` of
    `num_processes`, by default the run's), on `device` when `put_on_device`. The same loader `Accelerator.prepare`
    makes, with the settings given here."""
    if slice_fn_for_dispatch is not None:
        raise ValueError("prepare_data_loader(slice_fn_for_dispatch=...) is not supported by acc: dispatched batches "
                         "are sliced along dim 0; slice in the collate_fn instead")
    if torch_device_mesh is not None:
        raise ValueError("prepare_data_loader(torch_device_mesh=...): pass the mesh through "
                         "Accelerator(parallelism_config=...) instead")
    if num_processes is None or process_index is None:
        from acc.runtime.states import PartialState

        state = PartialState()
        num_processes = state.num_processes if num_processes is None else num_processes
        process_index = state.process_index if process_index is None else process_index
        device = state.device if device is None else device
    settings = DataSettings(split_batches=split_batches, even_batches=even_batches, dispatch_batches=dispatch_batches,
                            use_seedable_sampler=use_seedable_sampler, data_seed=data_seed, non_blocking=non_blocking,
                            resume_data_position=use_stateful_dataloader)
    run = _run()
    return PreparedDataLoader(dataloader, num_processes=num_processes, process_index=process_index,
                              device=device if put_on_device else None, settings=settings,
                              broadcast_object=run.broadcast_object if run is not None else None,
                              rng_types=rng_types)


__all__ = ["DataLoaderDispatcher", "DataLoaderShard", "DataLoaderStateMixin", "SkipBatchSampler", "SkipDataLoader",
           "prepare_data_loader"]
