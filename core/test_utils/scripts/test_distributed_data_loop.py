"""Data loaders over uneven data: acc's version of Accelerate's test_utils/scripts/test_distributed_data_loop.py.

    acc launch --backend ddp --nproc 2 PATH/test_distributed_data_loop.py     # two processes, what it is for
    python PATH/test_distributed_data_loop.py                                 # one process

Checks: `even_batches` (default) gives every process the same number of equally sized batches and can be turned
off; `join_uneven_inputs` lets processes with fewer batches finish, overrides `even_batches` for the map-style
loaders only (warning when an iterable one is prepared) and warns for models that cannot join (on one process it
does nothing, as in Accelerate); an Accelerator
pickles; every sample is seen once through `gather_for_metrics` (shuffled or not, with worker processes, a batch
sampler, a BatchSampler as sampler); a loader with `use_stateful_dataloader` resumes exactly where its
`state_dict()` or `save_state` was taken, for iterable and map-style data.

The expected batch sizes are given for one and two processes. Where Accelerate makes the run look like FSDP's to
see the join warning (`state.distributed_type = FSDP`), acc's states are views that cannot be assigned: the warning
is checked for a model that is not DDP-wrapped, what acc warns about.
"""

from __future__ import annotations

import pickle
import tempfile
import warnings
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    TensorDataset,
    default_collate,
)

from acc.accelerator import Accelerator
from acc.contract.kwargs import DataLoaderConfiguration
from acc.utils.operations import broadcast_object_list

NUM_ELEMENTS = 22
NUM_WORKERS = 4
BATCH_SIZE = 4


class DummyDataset(Dataset):
    """22 samples {"index", "label", "random_augmentation"}; an int, a slice or a list of indices."""

    def __len__(self) -> int:
        return NUM_ELEMENTS

    def _one(self, i: int) -> dict:
        return {"index": i, "label": i % 2, "random_augmentation": torch.rand(1).item()}

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int):
            return self._one(index)
        indices = range(*index.indices(NUM_ELEMENTS)) if isinstance(index, slice) else index
        return [self._one(i) for i in indices]


class DummyIterableDataset(IterableDataset):
    def __init__(self, data: Any):
        self.data = data

    def __iter__(self) -> Any:
        yield from self.data


def create_accelerator(even_batches: bool = True) -> Accelerator:
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=even_batches))
    assert accelerator.num_processes in (1, 2), "this script expects one or two processes"
    return accelerator


def create_dataloader(accelerator: Accelerator, dataset_size: int, batch_size: int, iterable: bool = False,
                      shuffle: bool = False) -> Any:
    values = torch.as_tensor(range(dataset_size))
    if shuffle:
        values = values[torch.randperm(values.size(0))]
    dataset = DummyIterableDataset(values) if iterable else TensorDataset(torch.as_tensor(range(dataset_size)))
    return accelerator.prepare(DataLoader(dataset, batch_size=batch_size))


def verify_dataloader_batch_sizes(accelerator: Accelerator, dataset_size: int, batch_size: int,
                                  expected: dict[int, list[list[int]]]) -> None:
    """`expected[num_processes][rank]`: the batch sizes that process gets."""
    loader = create_dataloader(accelerator, dataset_size=dataset_size, batch_size=batch_size)
    sizes = [len(batch[0]) for batch in loader]
    want = expected[accelerator.num_processes][accelerator.process_index]
    assert sizes == want, f"{dataset_size} samples in batches of {batch_size}: process " \
                          f"{accelerator.process_index} got batch sizes {sizes}, expected {want}"


def test_default_ensures_even_batch_sizes() -> None:
    accelerator = create_accelerator()
    verify_dataloader_batch_sizes(accelerator, 3, 1, {1: [[1, 1, 1]], 2: [[1, 1], [1, 1]]})
    verify_dataloader_batch_sizes(accelerator, 7, 2, {1: [[2, 2, 2, 1]], 2: [[2, 2], [2, 2]]})


def test_can_disable_even_batches() -> None:
    accelerator = create_accelerator(even_batches=False)
    verify_dataloader_batch_sizes(accelerator, 3, 1, {1: [[1, 1, 1]], 2: [[1, 1], [1]]})
    verify_dataloader_batch_sizes(accelerator, 7, 2, {1: [[2, 2, 2, 1]], 2: [[2, 2], [2, 1]]})


def test_can_join_uneven_inputs() -> None:
    accelerator = create_accelerator(even_batches=False)
    ddp_model = accelerator.prepare(torch.nn.Linear(1, 1))
    loader = create_dataloader(accelerator, dataset_size=3, batch_size=1)
    seen = []
    with accelerator.join_uneven_inputs([ddp_model]):
        for batch_idx, batch in enumerate(loader):
            ddp_model(batch[0].float()).sum().backward()
            seen.append(batch_idx)
    accelerator.wait_for_everyone()
    want = {1: [[0, 1, 2]], 2: [[0, 1], [0]]}[accelerator.num_processes][accelerator.process_index]
    assert seen == want, f"process {accelerator.process_index} trained batches {seen}, expected {want}"


def test_join_raises_warning_for_non_ddp_distributed(accelerator: Accelerator) -> None:
    if accelerator.num_processes == 1:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([torch.nn.Linear(1, 1)]):
            pass
    assert caught and issubclass(caught[-1].category, UserWarning), "joining a model that is not DDP-wrapped " \
                                                                     "did not warn"


def test_join_can_override_even_batches() -> None:
    accelerator = create_accelerator(even_batches=True)
    ddp_model = accelerator.prepare(torch.nn.Linear(1, 1))
    train_dl = create_dataloader(accelerator, dataset_size=3, batch_size=1)
    valid_dl = create_dataloader(accelerator, dataset_size=3, batch_size=1)
    with accelerator.join_uneven_inputs([ddp_model], even_batches=False):
        inside = (train_dl.batch_sampler.even_batches, valid_dl.batch_sampler.even_batches)
    want = (True, True) if accelerator.num_processes == 1 else (False, False)  # one process: the join does nothing
    assert inside == want, f"even_batches inside the join: {inside}, expected {want}"
    after = (train_dl.batch_sampler.even_batches, valid_dl.batch_sampler.even_batches)
    assert after == (True, True), f"even_batches after the join: {after}, expected back to True"


def test_join_can_override_for_mixed_type_dataloaders() -> None:
    accelerator = create_accelerator(even_batches=True)
    ddp_model = accelerator.prepare(torch.nn.Linear(1, 1))
    create_dataloader(accelerator, dataset_size=3, batch_size=1, iterable=True)
    batch_dl = create_dataloader(accelerator, dataset_size=3, batch_size=1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        try:
            with accelerator.join_uneven_inputs([ddp_model], even_batches=False):
                inside = batch_dl.batch_sampler.even_batches
        except AttributeError as exc:  # the iterable loader has no batch sampler to override
            raise AssertionError(f"overriding even_batches with an iterable loader prepared failed: {exc}") from exc
    assert inside is (accelerator.num_processes == 1), "even_batches was not overridden for the map-style loader"
    assert batch_dl.batch_sampler.even_batches is True, "even_batches was not restored after the join"


def test_join_raises_warning_for_iterable_when_overriding_even_batches() -> None:
    accelerator = create_accelerator()
    ddp_model = accelerator.prepare(torch.nn.Linear(1, 1))
    create_dataloader(accelerator, dataset_size=3, batch_size=1, iterable=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([ddp_model], even_batches=False):
            pass
    if accelerator.num_processes == 1:  # nothing to join on one process
        return
    assert caught and issubclass(caught[-1].category, UserWarning), \
        "overriding even_batches with an iterable-dataset loader prepared did not warn"
    assert "map-style" in str(caught[-1].message), f"the warning does not say even_batches applies to " \
                                                    f"map-style datasets only: {caught[-1].message}"


def test_pickle_accelerator() -> None:
    accelerator = create_accelerator()
    accelerator.prepare(create_dataloader(accelerator, dataset_size=32, batch_size=4))
    unpickled = pickle.loads(pickle.dumps(accelerator))
    assert accelerator.state.__dict__ == unpickled.state.__dict__, "the unpickled Accelerator's state differs"


def test_data_loader(data_loader: DataLoader, accelerator: Accelerator) -> None:
    """Every sample once through gather_for_metrics."""
    prepared = accelerator.prepare(data_loader)
    seen = []
    for batch in prepared:
        index, _ = accelerator.gather_for_metrics((batch["index"], batch["label"]))
        seen.extend(index.detach().cpu().tolist())
    assert sorted(seen) == list(range(NUM_ELEMENTS)), \
        f"Not every sample was seen exactly once in an epoch: {sorted(seen)}"


def _resume_check(accelerator: Accelerator, iterable: bool, save: Any, restore: Any) -> None:
    """Iterate, save at batch 2, keep what came after; restore and iterate again: the same batches."""
    old_config = accelerator.dataloader_config
    try:
        accelerator.dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True)
        loader = create_dataloader(accelerator, dataset_size=32 * accelerator.num_processes, batch_size=4,
                                   iterable=iterable, shuffle=True)
        after_save, saved = [], None
        for step, batch in enumerate(loader):
            if step == 2:
                saved = save(loader)
            if step > 2:
                after_save.append(batch)
        expected = accelerator.gather(after_save)
        restore(loader, saved)
        resumed = accelerator.gather(list(loader))
        assert len(expected) == len(resumed), f"Expected {len(expected)} batches after resume, got {len(resumed)}"
        for b1, b2 in zip(expected, resumed):
            for v1, v2 in zip(b1, b2):
                assert torch.equal(v1, v2), f"Batch {b1} and {b2} are not equal"
    finally:
        accelerator.dataloader_config = old_config


def test_stateful_dataloader(accelerator: Accelerator) -> None:
    """Resume through the loader's own state_dict() / load_state_dict()."""
    for iterable in (True, False):
        _resume_check(accelerator, iterable, lambda loader: loader.state_dict(),
                      lambda loader, state: loader.load_state_dict(state))


def test_stateful_dataloader_save_state(accelerator: Accelerator) -> None:
    """Resume through Accelerator.save_state() / load_state()."""
    for iterable in (True, False):
        with tempfile.TemporaryDirectory() as own:
            # one checkpoint directory for every process (Accelerate's test gives each process a temporary
            # directory of its own; an acc checkpoint is one directory that every process writes into)
            tmpdir = broadcast_object_list([own])[0]
            _resume_check(accelerator, iterable, lambda loader: accelerator.save_state(tmpdir),
                          lambda loader, state: accelerator.load_state(tmpdir))


def main() -> None:
    accelerator = create_accelerator()
    torch.manual_seed(accelerator.process_index)
    say = accelerator.print
    say("Test that even_batches variable ensures uniform batches across processes")
    test_default_ensures_even_batch_sizes()
    say("Run tests with even_batches disabled")
    test_can_disable_even_batches()
    say("Test joining uneven inputs")
    test_can_join_uneven_inputs()
    say("Test overriding even_batches when joining uneven inputs")
    test_join_can_override_even_batches()
    say("Test overriding even_batches for mixed dataloader types")
    test_join_can_override_for_mixed_type_dataloaders()
    say("Test join with a model that is not DDP-wrapped raises warning")
    test_join_raises_warning_for_non_ddp_distributed(accelerator)
    say("Test pickling an accelerator")
    test_pickle_accelerator()
    dataset = DummyDataset()
    say("Test DataLoader with shuffle=False")
    test_data_loader(DataLoader(dataset, shuffle=False, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS), accelerator)
    say("Test DataLoader with shuffle=True")
    test_data_loader(DataLoader(dataset, shuffle=True, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS), accelerator)
    say("Test DataLoader with batch_sampler")
    sampler = BatchSampler(RandomSampler(dataset), batch_size=BATCH_SIZE, drop_last=False)
    test_data_loader(DataLoader(dataset, batch_sampler=sampler, num_workers=NUM_WORKERS), accelerator)
    say("Test DataLoader with sampler as an instance of `BatchSampler`")
    sampler = BatchSampler(RandomSampler(dataset), batch_size=BATCH_SIZE, drop_last=False)
    test_data_loader(DataLoader(dataset, sampler=sampler, batch_size=None, collate_fn=default_collate,
                                num_workers=NUM_WORKERS), accelerator)
    say("Test a stateful DataLoader resumes from its state_dict")
    test_stateful_dataloader(accelerator)
    # the last two run even when the first fails (each fails alike on every process, so the processes stay in
    # step), and the script fails naming each that failed
    failed = []
    for title, check in (("a stateful DataLoader resumes from save_state",
                          lambda: test_stateful_dataloader_save_state(accelerator)),
                         ("overriding even_batches raises a warning for iterable dataloaders",
                          test_join_raises_warning_for_iterable_when_overriding_even_batches)):
        say(f"Test {title}")
        try:
            check()
        except AssertionError as exc:
            failed.append(f"{title}: {exc}")
    if failed:
        raise AssertionError("failed checks:\n  " + "\n  ".join(failed))
    accelerator.end_training()


if __name__ == "__main__":
    main()
