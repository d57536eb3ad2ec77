"""Data sharding logic, process by process in one interpreter (real multi-process runs: tests/plugins/ddp and
tests/differential, which compares with Accelerate itself)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, TensorDataset

from acc.runtime.data.loader import DataSettings, PreparedDataLoader, skip_first_batches
from acc.runtime.data.samplers import ShardedBatchSampler


class Broadcasts:
    """A broadcast between simulated ranks iterated one after the other: rank 0 records what it sends, the
    others receive it in the same order."""

    def __init__(self, world: int):
        self.sent: list = []
        self.received = {rank: 0 for rank in range(world)}

    def for_rank(self, rank: int):
        def broadcast(obj, src):
            if rank == src:
                self.sent.append(obj)
                return obj
            self.received[rank] += 1
            return self.sent[self.received[rank] - 1]
        return broadcast


def loaders(dataset, world: int, batch_size: int, shuffle: bool = False, seed: int = 0, drop_last: bool = False,
            **settings) -> list[PreparedDataLoader]:
    """One prepared loader per simulated rank; each rank starts from the same global RNG state, as processes
    that called set_seed do (iterate them rank by rank: see Broadcasts)."""
    out, channel = [], Broadcasts(world)
    for rank in range(world):
        torch.manual_seed(seed)
        base = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
        out.append(PreparedDataLoader(base, num_processes=world, process_index=rank, device=None,
                                      settings=DataSettings(**settings), broadcast_object=channel.for_rank(rank)))
    return out


def epoch(loaders_: list) -> list[list]:
    """Each process's batches (as lists of sample ids) for one pass."""
    return [[batch[0].tolist() if isinstance(batch, (list, tuple)) else batch.tolist() for batch in dl]
            for dl in loaders_]


def gathered(per_rank: list[list], loaders_: list) -> list:
    """What gather_for_metrics returns over the pass: rounds in rank order, the last one cut to `remainder`."""
    rounds = len(per_rank[0])
    assert all(len(b) == rounds for b in per_rank), "even_batches: every process takes the same number of steps"
    out = []
    for r in range(rounds):
        round_ = [x for rank in per_rank for x in rank[r]]
        if r == rounds - 1 and loaders_[0].remainder > 0:
            round_ = round_[: loaders_[0].remainder]
        out.extend(round_)
    return out


@pytest.mark.parametrize("last_batch", ["fill", "short"])
@pytest.mark.parametrize("n,world", [(82, 2), (82, 3), (96, 2), (50, 3), (5, 4)])
def test_unshuffled_gathered_order_is_the_dataset_once(n, world, last_batch):
    dls = loaders(TensorDataset(torch.arange(n)), world, batch_size=16, last_batch=last_batch)
    per_rank = epoch(dls)
    assert gathered(per_rank, dls) == list(range(n))
    assert all(len(dl) == len(per_rank[0]) for dl in dls)


def test_fill_completes_the_last_batch_from_the_start_of_the_epoch():
    """Accelerate's dealing: 50 samples, batches of 16 on 3 processes -> the short batch [48, 49] is filled up."""
    per_rank = epoch(loaders(TensorDataset(torch.arange(50)), 3, batch_size=16))
    assert per_rank[0][1] == [48, 49] + list(range(14))
    assert per_rank[1][1] == list(range(14, 30)) and per_rank[2][1] == list(range(30, 46))
    assert all(len(b) == 16 for rank in per_rank for b in rank)


def test_short_keeps_the_data_short_last_batch_short():
    """acc's dealing: the short batch stays short; only processes without a batch get one from the start."""
    dls = loaders(TensorDataset(torch.arange(50)), 3, batch_size=16, last_batch="short")
    per_rank = epoch(dls)
    assert per_rank[0][1] == [48, 49] and per_rank[1][1] == list(range(16)) and per_rank[2][1] == list(range(16, 32))
    assert dls[0].remainder == 2


def test_shuffled_ranks_agree_on_the_permutation_and_epochs_differ():
    dls = loaders(TensorDataset(torch.arange(64)), 2, batch_size=8, shuffle=True, seed=5)
    e1, e2 = epoch(dls), epoch(dls)
    g1, g2 = gathered(e1, dls), gathered(e2, dls)
    assert sorted(g1) == sorted(g2) == list(range(64)) and g1 != g2
    assert not set(x for b in e1[0] for x in b) & set(x for b in e1[1] for x in b)


def test_seedable_sampler_gives_one_process_the_same_global_batches():
    """use_seedable_sampler: 2 processes x batch 8 see what 1 process x batch 16 sees, epoch after epoch."""
    two = loaders(TensorDataset(torch.arange(64)), 2, batch_size=8, shuffle=True, seed=5, use_seedable_sampler=True)
    one = loaders(TensorDataset(torch.arange(64)), 1, batch_size=16, shuffle=True, seed=5, use_seedable_sampler=True)
    for _ in range(2):
        assert gathered(epoch(two), two) == [x for b in epoch(one)[0] for x in b]


def test_split_batches_divides_each_batch():
    dls = loaders(TensorDataset(torch.arange(20)), 2, batch_size=8, split_batches=True)
    per_rank = epoch(dls)
    assert per_rank[0][0] == [0, 1, 2, 3] and per_rank[1][0] == [4, 5, 6, 7]
    assert gathered(per_rank, dls) == list(range(20))
    with pytest.raises(ValueError, match="round multiple of the number of processes"):
        loaders(TensorDataset(torch.arange(20)), 3, batch_size=8, split_batches=True)


def test_drop_last_drops_the_incomplete_round():
    dls = loaders(TensorDataset(torch.arange(82)), 2, batch_size=16, drop_last=True)
    per_rank = epoch(dls)
    assert [len(r) for r in per_rank] == [2, 2] and dls[0].remainder == -1


def test_uneven_batches_when_asked():
    dls = loaders(TensorDataset(torch.arange(50)), 3, batch_size=16, even_batches=False)
    per_rank = epoch(dls)
    assert [len(r) for r in per_rank] == [2, 1, 1] and per_rank[0][1] == [48, 49]
    assert [len(dl) for dl in dls] == [2, 1, 1]


def test_one_process_runs_the_user_sampler_untouched():
    base = DataLoader(TensorDataset(torch.arange(10)), batch_size=4, shuffle=True)
    torch.manual_seed(3)
    plain = [b[0].tolist() for b in base]
    torch.manual_seed(3)
    (dl,) = [PreparedDataLoader(base, num_processes=1, process_index=0, device=None)]
    assert epoch([dl])[0] == plain and dl.synchronized_generator is None


class Stream(IterableDataset):
    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(torch.arange(self.n))


@pytest.mark.parametrize("dispatch", [True, False])
@pytest.mark.parametrize("n,world", [(82, 2), (82, 3), (64, 2), (3, 2)])
def test_iterable_datasets_are_shared_and_gathered_once(n, world, dispatch):
    dls = loaders(Stream(n), world, batch_size=16, dispatch_batches=dispatch)
    per_rank = epoch(dls)
    assert gathered(per_rank, dls) == list(range(n))


def test_end_of_dataloader_is_set_while_the_last_batch_is_out():
    (dl,) = loaders(TensorDataset(torch.arange(10)), 1, batch_size=4)
    flags = [dl.end_of_dataloader for _ in dl]
    assert flags == [False, False, True]


def test_iteration_advances_only_when_a_pass_completes():
    (dl,) = loaders(TensorDataset(torch.arange(10)), 1, batch_size=4)
    for _ in dl:
        break
    assert dl.iteration == 0 and dl.position() == (0, 1)
    list(dl)
    assert dl.iteration == 1 and dl.position() == (1, 0)


def test_skip_first_batches_returns_a_loader_that_shares_the_shuffling():
    """Accelerate's semantics: a new loader without the first batches; the original is unchanged."""
    a, = loaders(TensorDataset(torch.arange(20)), 1, batch_size=4, shuffle=True, seed=3, use_seedable_sampler=True)
    full = epoch([a])[0]
    a.set_epoch(0)
    skipping = skip_first_batches(a, 2)
    assert epoch([skipping])[0] == full[2:] and len(skipping) == len(a) - 2
    a.set_epoch(0)
    assert epoch([a])[0] == full
    with pytest.raises(ValueError, match="num_batches"):
        a.skip_first_batches(-1)


def test_skip_first_batches_of_a_plain_dataloader():
    base = DataLoader(TensorDataset(torch.arange(10)), batch_size=3)
    skipped = skip_first_batches(base, 2)
    assert [b[0].tolist() for b in skipped] == [[6, 7, 8], [9]] and len(skipped) == 2


def test_exact_resume_continues_the_pass_with_the_same_order():
    """resume_data_position: a position saved mid-pass, restored into a new loader, yields the rest of that pass."""
    def make(seed):
        return loaders(TensorDataset(torch.arange(40)), 1, batch_size=4, shuffle=True, seed=seed,
                       resume_data_position=True)[0]

    reference = make(9)
    list(reference)
    uninterrupted = epoch([reference])[0]  # epoch 1
    first = make(9)
    list(first)
    for i, _ in enumerate(first):
        if i == 2:
            state = first.state_dict()
            break
    fresh = make(1)  # another seed: the order must come from the checkpoint
    fresh.load_state_dict(state)
    assert (state["epoch"], state["batches"]) == (1, 3)
    assert epoch([fresh])[0] == uninterrupted[3:] and fresh.iteration == 2


def test_sampler_that_is_a_batch_sampler_works_on_one_process():
    """DataLoader(batch_size=None, sampler=BatchSampler(...)): batches come from the batch sampler."""
    base = DataLoader(TensorDataset(torch.arange(10)), sampler=BatchSampler(SequentialSampler(range(10)), 4, False),
                      batch_size=None)
    (dl,) = [PreparedDataLoader(base, num_processes=1, process_index=0, device=None)]
    assert [b[0].tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_loader_of_single_samples_is_refused():
    base = DataLoader(TensorDataset(torch.arange(10)), batch_size=None)
    with pytest.raises(ValueError, match="batch_size"):
        PreparedDataLoader(base, num_processes=2, process_index=0, device=None)


def test_sharded_sampler_length_matches_iteration():
    for n in range(1, 40):
        for w in (1, 2, 3):
            for even in (True, False):
                for last in ("fill", "short"):
                    for r in range(w):
                        s = ShardedBatchSampler(BatchSampler(range(n), 4, False), w, r, even_batches=even,
                                                last_batch=last)
                        assert len(s) == len(list(s)), (n, w, r, even, last)


@pytest.mark.parametrize("replacement,num_samples", [(False, None), (False, 25), (True, 40)])
def test_seedable_sampler_draws_randomsamplers_order_for_seed_plus_epoch_and_advances_when_used_up(
        replacement, num_samples):
    from torch.utils.data import RandomSampler

    from acc.runtime.data.samplers import SeedableRandomSampler

    data = list(range(10))
    sampler = SeedableRandomSampler(data, replacement=replacement, num_samples=num_samples, data_seed=7)
    for epoch in range(3):
        reference = list(RandomSampler(data, replacement=replacement, num_samples=num_samples,
                                       generator=torch.Generator().manual_seed(7 + epoch)))
        it = iter(sampler)
        first = [next(it) for _ in range(3)]
        assert sampler.epoch == epoch  # not advanced before the order is used up
        assert first + list(it) == reference
        assert sampler.epoch == epoch + 1
    abandoned = iter(sampler)
    next(abandoned)
    assert sampler.epoch == 3  # a pass left half-way does not advance the epoch
    assert list(sampler) == list(RandomSampler(data, replacement=replacement, num_samples=num_samples,
                                               generator=torch.Generator().manual_seed(10)))
