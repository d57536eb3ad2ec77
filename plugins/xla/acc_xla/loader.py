"""The xla backend's data path: batches uploaded by torch_xla's parallel loader underneath the kernel's
prepared loader, so the kernel's bookkeeping follows the batch the user holds."""

from __future__ import annotations

from typing import Any, Iterator


def step_seed(seed: int, epoch: int, index: int) -> int:
    """The XLA random seed of batch `index` of `epoch` for a loader seeded with `seed` (splitmix64)."""
    mask = 2**64 - 1
    x = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


class _DeviceFeed:
    """The kernel loader's CPU batches, uploaded to the XLA device by torch_xla's ParallelLoader (a
    background thread per device) and handed out by its per-device loader, which cuts the graph
    (`torch_xla.sync()`) at every fetch."""

    def __init__(self, source: Any, device: Any):
        self.source = source
        self.device = device

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[Any]:
        # the source is opened here, in the caller's thread and at the caller's moment (the parallel loader would
        # open it later in its thread): opening draws the sampler's seed from the global RNG, which a resumed pass
        # replays around this call (PreparedDataLoader._open)
        return self._feed(_Opened(iter(self.source), self.source))

    def _feed(self, opened: "_Opened") -> Iterator[Any]:
        from torch_xla.distributed.parallel_loader import ParallelLoader

        loader = ParallelLoader(opened, [self.device])
        try:
            yield from loader.per_device_loader(self.device)
        finally:
            loader.close()


class _Opened:
    """An iterator already opened, for a consumer that calls iter() itself (the parallel loader's thread)."""

    def __init__(self, iterator: Iterator[Any], source: Any):
        self._iterator, self._source = iterator, source

    def __iter__(self) -> Iterator[Any]:
        return self._iterator

    def __len__(self) -> int:
        return len(self._source)  # asked only of sources that have a length


class XlaDataLoader:
    """What `prepare` returns for a DataLoader on xla: the kernel's prepared loader, iterated as is.

    Underneath it, the parallel loader replaces the kernel's CPU batch source (sharded as usual), so the
    prepared loader's own bookkeeping (end_of_dataloader, the padding of the last round, the position
    saved in checkpoints, the active-loader registration) follows the batch the user holds, not the
    batches the background thread has read ahead. Attributes are the prepared loader's.
    """

    def __init__(self, prepared: Any):
        self._prepared = prepared

    def __iter__(self) -> Iterator[Any]:
        import torch_xla
        import torch_xla.core.xla_model as xm

        prepared = self._prepared
        try:
            for batch in prepared:
                # XLA's random state moves on at every graph cut, so extra cuts (a save, a barrier) would
                # shift the dropout masks of later steps: seed each step from its place in the data instead
                epoch, index = prepared.position()
                xm.set_rng_state(step_seed(prepared.seed, epoch, index))
                yield batch
        finally:
            torch_xla.sync()  # cut the last step of the epoch (or of a loop left early) like every other

    def __len__(self) -> int:
        return len(self._prepared)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._prepared, name)

    def __repr__(self) -> str:
        return f"XlaDataLoader({self._prepared!r})"
