"""Accelerate's data-loader classes built directly (acc.data_loader): DataLoaderShard, DataLoaderDispatcher,
SkipDataLoader, SkipBatchSampler, prepare_data_loader; and a prepared loader the script lets go of is freed."""

from __future__ import annotations

import weakref

import torch
from torch.utils.data import BatchSampler, DataLoader

from acc import Accelerator
from acc.data_loader import (
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    SkipBatchSampler,
    SkipDataLoader,
    prepare_data_loader,
    skip_first_batches,
)


def test_a_shard_is_a_dataloader_that_knows_the_end_of_each_pass():
    for cls in (DataLoaderShard, DataLoaderDispatcher):
        loader = cls(list(range(16)), batch_size=4)
        assert isinstance(loader, DataLoader) and isinstance(loader, DataLoaderStateMixin)
        for _ in range(2):
            ends = [loader.end_of_dataloader for _ in loader]
            assert ends == [False, False, False, True]
        loader.set_epoch(3)
        skipped = skip_first_batches(loader, 2)
        assert type(skipped) is cls and skipped.iteration == 3
        assert [b.tolist() for b in skipped] == [[8, 9, 10, 11], [12, 13, 14, 15]]


def test_skipping_a_batch_sampler_and_a_loader():
    assert list(SkipBatchSampler(BatchSampler(range(16), 4, False), 2)) == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert len(SkipBatchSampler(BatchSampler(range(16), 4, False), 3)) == 1
    assert [b.tolist() for b in SkipDataLoader(list(range(16)), batch_size=4, skip_batches=3)] == [[12, 13, 14, 15]]


def test_prepare_data_loader_gives_each_process_its_share():
    shares = [[b.tolist() for b in prepare_data_loader(DataLoader(list(range(8)), batch_size=2), num_processes=2,
                                                       process_index=i)] for i in range(2)]
    assert shares == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_a_prepared_loader_the_script_lets_go_of_is_freed_with_its_accelerator(fresh_pm):
    accelerator = Accelerator(plugin_manager=fresh_pm)
    loader = accelerator.prepare_data_loader(DataLoader(torch.arange(16), batch_size=4))
    iterator = iter(loader)
    assert next(iterator).tolist() == [0, 1, 2, 3]  # mid-pass: it is the run's active loader
    refs = weakref.ref(accelerator), weakref.ref(loader)
    del accelerator, loader, iterator
    assert [r() for r in refs] == [None, None]  # by reference counting alone: nothing holds them in a cycle


def test_a_loader_prepared_again_takes_the_new_data_seed():
    from acc import Accelerator, DataLoaderConfiguration

    loader = DataLoader(list(range(32)), batch_size=4, shuffle=True)

    def order(seed):
        prepared = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True,
                                                                         data_seed=seed)).prepare(loader)
        return [int(x) for batch in prepared for x in batch]

    assert order(42) == order(42) and order(42) != order(43)


def test_a_dataloader_config_assigned_later_applies_to_what_is_prepared_after():
    from acc import Accelerator, DataLoaderConfiguration

    accelerator = Accelerator()
    assert accelerator.use_stateful_dataloader is False and accelerator.use_seedable_sampler is False
    accelerator.dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True, use_seedable_sampler=True,
                                                            data_seed=7, even_batches=False)
    assert accelerator.use_stateful_dataloader is True and accelerator.even_batches is False
    assert accelerator.settings.source("data_seed") == "code accelerator.dataloader_config = ..."
    prepared = accelerator.prepare(DataLoader(list(range(8)), batch_size=2, shuffle=True))
    assert type(prepared.sampler).__name__ == "SeedableRandomSampler" and prepared.sampler.initial_seed == 7
