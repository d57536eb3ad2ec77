"""The prepared loader's whole-batch read of a TensorDataset: the batches, their form and the RNG stream are those of
torch's sample-by-sample read, and it is used only where that holds."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from acc.runtime.data.loader import PreparedDataLoader
from acc.runtime.data.tensor_rows import BatchedRows


class Rows(Dataset):
    """The same rows as a TensorDataset, read one sample at a time (torch's path)."""

    def __init__(self, *tensors: torch.Tensor):
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, i):
        return tuple(t[i] for t in self.tensors)


class SubTensorDataset(TensorDataset):
    def __getitem__(self, i):
        x, *rest = super().__getitem__(i)
        return (x * 2, *rest)


def tensors():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(103, 5, generator=g), torch.randint(0, 10, (103,), generator=g),
            torch.randn(103, 2, 3, generator=g).double())


def passes(dataset, world=2, rank=1, epochs=2, **loader_kwargs):
    """Every batch of `epochs` passes of rank `rank`'s prepared loader, and the global RNG state after them."""
    torch.manual_seed(7)
    base = DataLoader(dataset, batch_size=8, shuffle=True, **loader_kwargs)
    prepared = PreparedDataLoader(base, num_processes=world, process_index=rank, device=None)
    batches = [batch for _ in range(epochs) for batch in prepared]
    return prepared, batches, torch.get_rng_state()


@pytest.mark.parametrize("world,rank", [(1, 0), (2, 1), (3, 0)])
def test_whole_batch_reads_give_torchs_batches_and_rng_stream(world, rank):
    fast, got, rng_after = passes(TensorDataset(*tensors()), world, rank)
    _, want, want_rng = passes(Rows(*tensors()), world, rank)
    assert isinstance(fast._torch_loader.dataset, BatchedRows)
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert type(a) is type(b) is list  # default_collate makes a list of a tuple sample
        assert [t.dtype for t in a] == [t.dtype for t in b] and [t.shape for t in a] == [t.shape for t in b]
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(rng_after, want_rng)  # the DataLoader's own draws (its base seed per pass) are unchanged


@pytest.mark.parametrize("make,kwargs", [
    (lambda: SubTensorDataset(*tensors()), {}),  # a subclass may read rows its own way
    (lambda: TensorDataset(*tensors()), {"collate_fn": lambda batch: batch}),  # the user's collate
    (lambda: TensorDataset(*tensors()), {"num_workers": 1}),  # read in a worker process
])
def test_torchs_read_is_kept_where_the_whole_batch_read_could_differ(make, kwargs):
    prepared, batches, _ = passes(make(), epochs=1, **kwargs)
    assert not isinstance(prepared._torch_loader.dataset, BatchedRows)
    assert batches


def test_a_subclass_still_gets_its_own_rows():
    _, got, _ = passes(SubTensorDataset(*tensors()), epochs=1)
    _, plain, _ = passes(TensorDataset(*tensors()), epochs=1)
    assert torch.equal(got[0][0], plain[0][0] * 2)


def test_the_user_sees_their_own_dataset():
    dataset = TensorDataset(*tensors())
    prepared, _, _ = passes(dataset, epochs=1)
    assert prepared.dataset is dataset and prepared.total_dataset_length == 103
