"""Data sharding logic, process by process (the real multi-process runs are in tests/plugins/ddp)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from acc.data import PreparedDataLoader, ShardedBatchSampler


def loaders(dataset, world: int, batch_size: int, shuffle: bool = False, seed: int = 0, **kw) -> list:
    base = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=kw.pop("drop_last", False))
    return [PreparedDataLoader(base, num_processes=world, process_index=r, device=None, seed=seed, **kw)
            for r in range(world)]


def epoch(loaders_: list) -> list[list]:
    """Each process's batches (as lists of sample ids) for one epoch, plus the last-round facts."""
    out = []
    for dl in loaders_:
        out.append([batch[0].tolist() if isinstance(batch, (list, tuple)) else batch.tolist() for batch in dl])
    return out


def gathered(per_rank: list[list], loaders_: list) -> list:
    """What gather_for_metrics would return over the epoch: rounds in rank order, padding cut."""
    rounds = len(per_rank[0])
    assert all(len(b) == rounds for b in per_rank), "even_batches: every process takes the same number of steps"
    out = []
    for r in range(rounds):
        round_ = [x for rank in per_rank for x in rank[r]]
        if r == rounds - 1 and loaders_[0].padded_last_round:
            round_ = round_[: loaders_[0].real_in_last_round]
        out.extend(round_)
    return out


@pytest.mark.parametrize("n,world", [(82, 2), (82, 3), (96, 2), (50, 3), (5, 4)])
def test_unshuffled_gathered_order_is_the_dataset_once(n, world):
    dls = loaders(TensorDataset(torch.arange(n)), world, batch_size=16)
    per_rank = epoch(dls)
    assert all(len(batch) == 16 for rank in per_rank for batch in rank[:-1])
    assert gathered(per_rank, dls) == list(range(n))
    assert all(len(dl) == len(per_rank[0]) for dl in dls)


def test_ranks_get_disjoint_samples_except_documented_padding():
    dls = loaders(TensorDataset(torch.arange(50)), 3, batch_size=16)
    per_rank = epoch(dls)
    flat = [x for rank in per_rank for batch in rank for x in batch]
    assert sorted(set(flat)) == list(range(50))
    # batches 16,16,16,2: the last round has one real (short) batch; ranks 1 and 2 get 16 padding samples each,
    # taken from the start of the epoch
    assert per_rank[0][1] == [48, 49] and per_rank[1][1] == list(range(16)) and per_rank[2][1] == list(range(16, 32))
    assert dls[0].padded_last_round and dls[0].real_in_last_round == 2
    complete = loaders(TensorDataset(torch.arange(82)), 2, batch_size=16)
    per_rank = epoch(complete)
    assert sum(len(b) for rank in per_rank for b in rank) == 82 and not complete[0].padded_last_round


def test_shuffled_epochs_cover_the_dataset_and_differ():
    dls = loaders(TensorDataset(torch.arange(64)), 2, batch_size=8, shuffle=True, seed=5)
    e1, e2 = epoch(dls), epoch(dls)
    g1, g2 = gathered(e1, dls), gathered(e2, dls)
    assert sorted(g1) == sorted(g2) == list(range(64)) and g1 != g2
    # the same seed gives the same permutation on one process with the global batch size
    single = loaders(TensorDataset(torch.arange(64)), 1, batch_size=16, shuffle=True, seed=5)
    assert [x for b in epoch(single)[0] for x in b] == g1


def test_split_batches_divides_each_batch():
    dls = loaders(TensorDataset(torch.arange(20)), 2, batch_size=8, split_batches=True)
    per_rank = epoch(dls)
    assert per_rank[0][0] == [0, 1, 2, 3] and per_rank[1][0] == [4, 5, 6, 7]
    assert gathered(per_rank, dls) == list(range(20))
    with pytest.raises(ValueError, match="divisible"):
        loaders(TensorDataset(torch.arange(20)), 3, batch_size=8, split_batches=True)


def test_drop_last_drops_the_incomplete_round():
    dls = loaders(TensorDataset(torch.arange(82)), 2, batch_size=16, drop_last=True)
    per_rank = epoch(dls)
    assert [len(r) for r in per_rank] == [2, 2] and not dls[0].padded_last_round


def test_uneven_batches_when_asked():
    dls = loaders(TensorDataset(torch.arange(50)), 3, batch_size=16, even_batches=False)
    per_rank = epoch(dls)
    assert [len(r) for r in per_rank] == [2, 1, 1] and per_rank[0][1] == [48, 49]
    assert [len(dl) for dl in dls] == [2, 1, 1]


class Stream(IterableDataset):
    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(torch.arange(self.n))


@pytest.mark.parametrize("n,world", [(82, 2), (82, 3), (64, 2)])
def test_iterable_datasets_are_sharded_and_padded(n, world):
    dls = loaders(Stream(n), world, batch_size=16)
    per_rank = epoch(dls)
    assert gathered(per_rank, dls) == list(range(n))


def test_end_of_dataloader_is_set_while_the_last_batch_is_out():
    (dl,) = loaders(TensorDataset(torch.arange(10)), 1, batch_size=4)
    flags = [dl.end_of_dataloader for _ in dl]
    assert flags == [False, False, True]


def test_skip_first_batches_resumes_mid_epoch():
    (dl,) = loaders(TensorDataset(torch.arange(20)), 1, batch_size=4, shuffle=True, seed=3)
    full = epoch([dl])[0]
    dl.set_epoch(0)
    dl.skip_first_batches(2)
    assert epoch([dl])[0] == full[2:]


def test_sharded_sampler_length_matches_iteration():
    for n in range(1, 40):
        for w in (1, 2, 3):
            for even in (True, False):
                for r in range(w):
                    s = ShardedBatchSampler(torch.utils.data.BatchSampler(range(n), 4, False), w, r,
                                            even_batches=even)
                    assert len(s) == len(list(s)), (n, w, r, even)
