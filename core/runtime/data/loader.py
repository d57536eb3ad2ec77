"""Prepared data loaders: each process gets its share of every epoch, on its device.

By default a prepared loader yields, on every rank, the batches Hugging Face Accelerate 1.15 yields for the
same script and seed (`sharding.py` says how batches are dealt):

- shuffling: with more than one process, the loader's sampler gets a generator seeded from torch's global RNG
  at `prepare`, and at the start of every pass rank 0's generator state is sent to every rank (the
  `rng_types` of `Accelerator`, default `["generator"]`), so all ranks draw the same permutation. On one
  process the user's sampler runs untouched. `use_seedable_sampler` instead shuffles epoch e with
  `data_seed + e` (acc's preset): the order then depends only on the seed and the epoch.
- iterable datasets are read by the main process and dispatched (each rank gets its slice of N batches), unless
  `dispatch_batches=False`, where each rank reads the stream and keeps its slice.
- `iteration` (the epoch number given to `set_epoch`) advances when a pass completes.

With `resume_data_position` (acc's exact resume), a checkpoint also records where the data stream stood (the
pass, the batches already taken, the shuffling state of that pass), and `load_state` continues there.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from acc.runtime import ops
from acc.runtime.data.samplers import IterableShard, SeedableRandomSampler, ShardedBatchSampler
from acc.runtime.data.tensor_rows import batched_rows

_LOADER_ARGS = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
    "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
)


@dataclass(frozen=True)
class DataSettings:
    """What a prepared loader needs to know about the run (from settings and `DataLoaderConfiguration`)."""

    split_batches: bool = False
    even_batches: bool = True
    last_batch: str = "fill"
    dispatch_batches: bool | None = None
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    resume_data_position: bool = False


def _loader_kwargs(loader: DataLoader) -> dict[str, Any]:
    accepted = inspect.signature(DataLoader.__init__).parameters
    kwargs = {}
    for name in _LOADER_ARGS:
        if name in accepted and hasattr(loader, name):
            if name == "prefetch_factor" and loader.num_workers == 0:
                continue
            kwargs[name] = getattr(loader, name)
    return kwargs


def draw_seed() -> int:
    """A seed drawn from torch's global RNG, as a RandomSampler without a generator draws one."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


def synchronize_generator(generator: torch.Generator, broadcast_object: Callable[[Any, int], Any]) -> None:
    """Give `generator` rank 0's state on every rank (`broadcast_object` takes the state tensor and the source)."""
    generator.set_state(broadcast_object(generator.get_state(), 0))


def synchronize_rng_states(rng_types: list[str], generator: torch.Generator | None,
                           broadcast_object: Callable[[Any, int], Any]) -> None:
    """Rank 0's state for each RNG named in `rng_types` ("torch", "cuda", "mps", "generator") on every rank."""
    for kind in rng_types:
        kind = str(getattr(kind, "value", kind))
        if kind == "generator":
            if generator is not None:
                synchronize_generator(generator, broadcast_object)
        elif kind == "torch":
            torch.set_rng_state(broadcast_object(torch.get_rng_state(), 0))
        elif kind == "cuda" and torch.cuda.is_available():
            torch.cuda.set_rng_state(broadcast_object(torch.cuda.get_rng_state(), 0))
        elif kind == "mps" and torch.backends.mps.is_available():
            torch.mps.set_rng_state(broadcast_object(torch.mps.get_rng_state(), 0))
        elif kind not in ("cuda", "mps", "xla"):
            raise ValueError(f"rng_types: unknown RNG {kind!r}; valid: torch, cuda, mps, xla, generator")


def inner_sampler(loader: DataLoader) -> Any:
    """The index sampler under a loader's batching (the one that shuffles), or None."""
    if isinstance(loader.sampler, BatchSampler):
        return getattr(loader.sampler, "sampler", None)
    return getattr(loader.batch_sampler, "sampler", None)


def _set_inner_sampler(loader: DataLoader, sampler: Any) -> None:
    holder = loader.sampler if isinstance(loader.sampler, BatchSampler) else loader.batch_sampler
    holder.sampler = sampler


@dataclass
class _Progress:
    """Where the stream of a loader (and of its `skip_first_batches` copies) stands, for checkpoints."""

    epoch: int = 0
    batches: int = 0
    iterating: bool = False


class PreparedDataLoader:
    """What `Accelerator.prepare` returns for a DataLoader.

    Iterating yields this process's batches on `device`. While the last batch of a pass is out,
    `end_of_dataloader` is True and `remainder` is the number of real samples in the last global batch (-1:
    unknown), so `gather_for_metrics` can drop the samples added to even the last round.
    """

    def __init__(
        self,
        loader: DataLoader,
        *,
        num_processes: int,
        process_index: int,
        device: Any,
        settings: DataSettings = DataSettings(),
        broadcast_object: Callable[[Any, int], Any] | None = None,
        broadcast_state: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
        rng_types: list[str] | None = None,
        on_start: Callable[["PreparedDataLoader"], None] | None = None,
        on_end: Callable[["PreparedDataLoader"], None] | None = None,
    ):
        self.base_loader = loader
        self.dataset = loader.dataset
        self.device = device
        self.num_processes = num_processes
        self.process_index = process_index
        self.settings = settings
        self._broadcast = broadcast_object or (lambda obj, src: obj)
        # RNG states at each pass's start: one tensor broadcast where given (a CPU generator's 5 KB state took
        # 2.4 ms pickled through broadcast_object on gloo, 0.57 ms as a tensor: 14 us a step on 128-step epochs)
        self._broadcast_state = broadcast_state or self._broadcast
        self._on_start, self._on_end = on_start, on_end
        self.iteration = 0
        self.end_of_dataloader = False
        self.remainder = -1
        self.skip_batches = 0  # skipped at the start of every pass (a `skip_first_batches` copy)
        self._resume: tuple[int, Any] | None = None  # (batches, global RNG state at the pass's start)
        self._pass_state: dict[str, Any] = {}
        self._progress = _Progress()
        self._generation = 0
        self.seed = settings.data_seed if settings.data_seed is not None else torch.initial_seed()
        self.synchronized_generator: torch.Generator | None = None
        self._shard: Any = None
        self._iterable_shard: IterableShard | None = None
        self.drop_last = bool(getattr(loader, "drop_last", False))
        iterable = isinstance(loader.dataset, IterableDataset)
        dispatch = settings.dispatch_batches
        self.dispatch = (device is not None and iterable) if dispatch is None else bool(dispatch)
        many = num_processes > 1
        sampler = None if iterable else inner_sampler(loader)
        if settings.use_seedable_sampler and isinstance(sampler, RandomSampler):
            # a fresh one for this prepare's data_seed (a loader prepared before already holds a seedable one)
            sampler = SeedableRandomSampler(sampler.data_source, replacement=sampler.replacement,
                                            num_samples=sampler._num_samples, generator=sampler.generator,
                                            data_seed=settings.data_seed)
            _set_inner_sampler(loader, sampler)
        elif (many or settings.resume_data_position) and not self.dispatch and sampler is not None \
                and not isinstance(sampler, SeedableRandomSampler) and hasattr(sampler, "generator"):
            if sampler.generator is None:  # all ranks shuffle alike: rank 0's generator state, every pass
                sampler.generator = torch.Generator()
                sampler.generator.manual_seed(draw_seed())
            self.synchronized_generator = sampler.generator
        self.sampler = sampler
        types = list(rng_types if rng_types is not None else ["generator"])
        if self.synchronized_generator is None:
            types = [t for t in types if str(getattr(t, "value", t)) != "generator"]
        self.rng_types = types if not self.dispatch else []
        kwargs = _loader_kwargs(loader)
        if iterable:
            if many and not self.dispatch:
                generator = getattr(loader.dataset, "generator", None)
                if isinstance(generator, torch.Generator):
                    self.synchronized_generator = generator
                    self.rng_types = list(rng_types if rng_types is not None else ["generator"])
                self._iterable_shard = IterableShard(loader.dataset, loader.batch_size or 1, self.drop_last,
                                                     num_processes, process_index, settings.split_batches)
                size = (loader.batch_size or 1) // (num_processes if settings.split_batches else 1)
                self._torch_loader = DataLoader(self._iterable_shard, batch_size=size, drop_last=self.drop_last,
                                                **kwargs)
            else:
                self._torch_loader = DataLoader(loader.dataset, batch_size=loader.batch_size,
                                                drop_last=self.drop_last, **kwargs)
        else:
            sampler_is_batch_sampler = isinstance(loader.sampler, BatchSampler)
            batch_sampler = loader.sampler if sampler_is_batch_sampler else loader.batch_sampler
            if batch_sampler is None:
                raise ValueError("prepare() needs a DataLoader with a batch_size, a batch_sampler, or a BatchSampler "
                                 "as its sampler (got batch_size=None and a sampler of single indices)")
            dealt = many and not self.dispatch
            self._shard = ShardedBatchSampler(
                batch_sampler, num_processes if dealt else 1, process_index if dealt else 0,
                settings.split_batches, settings.even_batches, settings.last_batch)
            if sampler_is_batch_sampler:
                self._torch_loader = DataLoader(loader.dataset, sampler=self._shard, batch_size=None, **kwargs)
            else:
                dataset, kwargs = batched_rows(loader.dataset, kwargs)
                self._torch_loader = DataLoader(dataset, batch_sampler=self._shard, **kwargs)
        self._loader: Any = _Dispatched(self) if self.dispatch else self._torch_loader
        per = self._original_batch_size()
        split = settings.split_batches
        self.total_batch_size = per if split else (per or 0) * num_processes
        self.per_process_batch_size = (per // num_processes if split else per) if per else per

    # ------------------------------------------------------------------ facts
    def _original_batch_size(self) -> int | None:
        loader = self.base_loader
        if isinstance(loader.sampler, BatchSampler):
            return getattr(loader.sampler, "batch_size", None)
        if loader.batch_size is not None:
            return loader.batch_size
        return getattr(loader.batch_sampler, "batch_size", None)

    @property
    def batch_size(self) -> int | None:
        return self.base_loader.batch_size

    @property
    def batch_sampler(self) -> Any:
        return self._shard

    @property
    def total_dataset_length(self) -> int:
        return len(self.dataset)

    @property
    def gradient_state(self) -> Any:
        """The run's GradientState (Accelerate's loaders carry it): a view, made when asked."""
        from acc.runtime.states import GradientState

        return GradientState()

    def get_sampler(self) -> Any:
        return self.sampler

    def __len__(self) -> int:
        if self.dispatch:
            length = len(self.base_loader)
            rounds = length if self.settings.split_batches else -(-length // self.num_processes)
            if self.drop_last and not self.settings.split_batches:
                rounds = length // self.num_processes
            return max(0, rounds - self.skip_batches)
        return max(0, len(self._torch_loader) - self.skip_batches)

    # ------------------------------------------------------------------ epochs and positions
    def set_epoch(self, epoch: int) -> None:
        """The epoch number the next pass gives the sampler (and dataset) through their `set_epoch`."""
        self.iteration = epoch
        user_batches = self._shard.batch_sampler if self._shard is not None else None
        for obj in (user_batches, self.sampler):
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)
        if not callable(getattr(self.sampler, "set_epoch", None)):
            target = self._iterable_shard if self._iterable_shard is not None else self.dataset
            if callable(getattr(target, "set_epoch", None)):
                target.set_epoch(epoch)

    def position(self) -> tuple[int, int]:
        """(epoch, batches already taken) of the pass in progress or left early; (next epoch, 0) after a full one."""
        return self._progress.epoch, self._progress.batches

    def state_dict(self) -> dict[str, Any]:
        """Where the data stream stands, for exact resume (`resume_data_position`)."""
        epoch, batches = self.position()
        state: dict[str, Any] = {"epoch": epoch, "batches": batches, "seed": int(self.seed)}
        if batches and self._pass_state:
            state.update(self._pass_state)
        elif self.synchronized_generator is not None:
            state["generator"] = self.synchronized_generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved position: the next pass is the saved epoch, after the batches already taken."""
        self.set_epoch(int(state["epoch"]))
        self.seed = state.get("seed", self.seed)
        if state.get("generator") is not None and self.synchronized_generator is not None:
            self.synchronized_generator.set_state(state["generator"])
        self._progress = _Progress(int(state["epoch"]), int(state["batches"]))
        self._resume = (int(state["batches"]), state.get("torch"))

    def skip_first_batches(self, num_batches: int = 0) -> "PreparedDataLoader":
        """A copy of this loader that skips the first `num_batches` batches of each of its passes (it shares
        this loader's sampler and shuffling state, as Accelerate's does; use it for the epoch being resumed)."""
        if num_batches < 0:
            raise ValueError(f"skip_first_batches: num_batches must be >= 0, got {num_batches}")
        clone = copy.copy(self)
        clone.skip_batches = self.skip_batches + num_batches
        clone._resume = None
        return clone

    def feed_through(self, wrap: Callable[[Any], Any]) -> None:
        """Let a backend move batches itself: `wrap(source)` replaces this loader's (sharded, CPU) batch source
        underneath its bookkeeping, and the kernel stops moving batches to the device (e.g. XLA's parallel
        loader uploads them ahead in a background thread)."""
        self._loader = wrap(self._loader)
        self.device = None

    # ------------------------------------------------------------------ iteration
    def _begin_pass(self) -> int:
        """Before a pass: shuffling state agreed across ranks, the epoch given to samplers; returns batches to skip."""
        resume, self._resume = self._resume, None
        if self.rng_types and self.num_processes > 1 and resume is None:
            synchronize_rng_states(self.rng_types, self.synchronized_generator, self._broadcast_state)
        self.set_epoch(self.iteration)
        if self.settings.resume_data_position:
            self._pass_state = {"torch": torch.get_rng_state()}
            if self.synchronized_generator is not None:
                self._pass_state["generator"] = self.synchronized_generator.get_state()
        self.end_of_dataloader = False
        self.remainder = -1
        skip = self.skip_batches
        if resume is not None:
            skip += resume[0]
            if resume[1] is not None:
                self._pass_state["torch"] = resume[1]
        return skip

    def _open(self, skip: int, replay_rng: Any) -> Iterator[Any]:
        """The batch source's iterator, skipping `skip` batches (without loading them where the sampler allows)."""
        if self._shard is not None and self._loader is self._torch_loader:
            self._shard.skip, skip = skip, 0
        current = None
        if replay_rng is not None:  # draw the pass's worker seeds as the interrupted pass drew them
            current = torch.get_rng_state()
            torch.set_rng_state(replay_rng)
        try:
            it = iter(self._loader)
        finally:
            if current is not None:
                torch.set_rng_state(current)
        for _ in range(skip):
            if next(it, _END) is _END:
                break
        return it

    def __iter__(self) -> Iterator[Any]:
        self._generation += 1
        generation = self._generation
        replay = self._resume[1] if self._resume is not None else None
        skip = self._begin_pass()
        progress = self._progress
        progress.epoch, progress.batches, progress.iterating = self.iteration, skip, True
        it = self._open(skip, replay)
        if self._on_start:
            self._on_start(self)
        completed = False
        try:
            current = next(it, _END)
            if current is _END:
                self.end_of_dataloader = completed = True
                return
            while True:
                upcoming = next(it, _END)
                if upcoming is _END:
                    self.end_of_dataloader = True
                    self.remainder = self._last_remainder()
                progress.batches += 1
                yield self._place(current)
                if upcoming is _END:
                    completed = True
                    break
                current = upcoming
        finally:
            if generation == self._generation:
                progress.iterating = False
                if completed:
                    self.iteration += 1
                    progress.epoch, progress.batches = self.iteration, 0
            if self._on_end:
                self._on_end(self)

    def _last_remainder(self) -> int:
        """Real samples in the last global batch of this pass (what gather_for_metrics keeps); -1 unknown."""
        if self.dispatch:
            return self._loader.remainder if isinstance(self._loader, _Dispatched) else -1
        if self.drop_last:
            return -1
        if self._iterable_shard is not None:
            return self._iterable_shard.real_in_last_round
        if self._shard is not None and self.settings.last_batch == "short":
            return self._shard.real_in_last_round if self._shard.padded_last_round else 0
        try:
            return len(self.dataset) % self.total_batch_size
        except (TypeError, ZeroDivisionError):
            return -1

    def _place(self, batch: Any) -> Any:
        """`batch` on this loader's device (a DataLoader's batches are CPU tensors: nothing to do for the CPU)."""
        device = self.device
        if device is None or (isinstance(device, torch.device) and device.type == "cpu"):
            return batch
        return ops.send_to_device(batch, device, non_blocking=self.settings.non_blocking)

    def __repr__(self) -> str:
        return (f"PreparedDataLoader(process {self.process_index} of {self.num_processes}, {len(self)} batches, "
                f"batch size {self.per_process_batch_size})")


_END = object()


class _Dispatched:
    """The batch source of a dispatching loader: the main process reads the data, every rank gets its slice.

    Each step the main process takes N batches (one with `split_batches`), joins them and sends them to every
    rank, which keeps its contiguous slice. A short last round is split evenly, completed with the first
    samples of the pass so every rank gets the same number; `remainder` then holds the real samples in it.
    """

    def __init__(self, owner: PreparedDataLoader):
        self.owner = owner
        self.remainder = -1

    def _fetch(self, it: Iterator[Any] | None) -> tuple[Any, bool]:
        """(the joined batches of the next round or None, whether the source is exhausted) on every rank."""
        owner = self.owner
        take = 1 if owner.settings.split_batches else owner.num_processes
        batches, exhausted = [], False
        if owner.process_index == 0:
            for _ in range(take):
                batch = next(it, _END)
                if batch is _END:
                    exhausted = True
                    break
                batches.append(batch)
            if batches and exhausted and (owner.drop_last or owner.settings.split_batches):
                batches = []
            payload = (ops.concatenate(batches) if len(batches) > 1 else (batches[0] if batches else None),
                       exhausted)
        else:
            payload = None
        return owner._broadcast(payload, 0) if owner.num_processes > 1 else payload

    def __iter__(self) -> Iterator[Any]:
        owner = self.owner
        n, r = owner.num_processes, owner.process_index
        it = iter(owner._torch_loader)  # every rank opens it, as its worker seeds come from the global RNG
        self.remainder = -1
        current, exhausted = self._fetch(it)
        if current is None:
            return
        first = ops.slice_batch(current, slice(0, n))
        while True:
            upcoming = None
            if not exhausted:
                upcoming, exhausted = self._fetch(it)
            last = upcoming is None
            observed = ops.batch_size(current)
            per = observed // n
            if last and not owner.drop_last and observed % n:
                current = ops.concatenate([current, first])
                per += 1
            if last:
                self.remainder = observed
            yield ops.slice_batch(current, slice(r * per, (r + 1) * per))
            if last:
                return
            current = upcoming


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """A loader that skips the first `num_batches` batches (Accelerate's function): for a prepared loader, a copy
    sharing its sampler; for a plain DataLoader, a new DataLoader over the same data."""
    if hasattr(dataloader, "skip_first_batches") and callable(dataloader.skip_first_batches):
        return dataloader.skip_first_batches(num_batches)
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"skip_first_batches needs a DataLoader, got {type(dataloader).__name__}")
    kwargs = _loader_kwargs(dataloader)
    if isinstance(dataloader.dataset, IterableDataset):
        return _SkippingLoader(dataloader, num_batches)
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    batches = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
    shard = ShardedBatchSampler(batches)
    shard.skip = 0
    skipping = _Skip(shard, num_batches)
    if sampler_is_batch_sampler:
        return DataLoader(dataloader.dataset, sampler=skipping, batch_size=None, **kwargs)
    return DataLoader(dataloader.dataset, batch_sampler=skipping, **kwargs)


class _Skip:
    """A batch sampler without its first `count` batches (on every pass)."""

    def __init__(self, batch_sampler: Any, count: int):
        self.batch_sampler, self.count = batch_sampler, count
        self.batch_size = getattr(batch_sampler, "batch_size", None)

    def __iter__(self) -> Iterator[list]:
        self.batch_sampler.skip = self.count
        return iter(self.batch_sampler)

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.count)


class _SkippingLoader:
    """An iterable-dataset loader without its first `count` batches (on every pass)."""

    def __init__(self, loader: DataLoader, count: int):
        self.loader, self.count = loader, count

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        for _ in range(self.count):
            if next(it, _END) is _END:
                return
        yield from it

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
