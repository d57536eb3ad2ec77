"""Skipping batches with DataLoader worker processes (num_workers > 0): skip_first_batches and exact resume.

A DataLoader with workers calls iter() on its batch sampler twice and advances only the second iterator; the
skip of a pass was taken by the first one, so both skipped nothing (found by the chaos soak with --workers 2)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, DataLoaderConfiguration, set_seed


def batches(loader) -> list[list[int]]:
    return [b[-1].tolist() for b in loader]


@pytest.mark.parametrize("shuffle", [False, True])
def test_skip_first_batches_skips_with_workers(fresh_pm, shuffle):
    data = TensorDataset(torch.randn(40, 2), torch.arange(40))
    got = {}
    for workers in (0, 2):
        set_seed(3)
        acc = Accelerator(plugin_manager=fresh_pm)
        loader = acc.prepare(DataLoader(data, batch_size=4, shuffle=shuffle, num_workers=workers))
        got[workers] = batches(acc.skip_first_batches(loader, 3))
    assert len(got[2]) == 7 and got[2] == got[0]


def test_exact_resume_with_workers_continues_with_the_next_batch(fresh_pm, tmp_path):
    config = {"dataloader_config": DataLoaderConfiguration(use_stateful_dataloader=True)}
    data = TensorDataset(torch.randn(40, 2), torch.arange(40))

    def setup():
        set_seed(1)
        acc = Accelerator(plugin_manager=fresh_pm, **config)
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return (acc, *acc.prepare(model, opt, DataLoader(data, batch_size=4, shuffle=True, num_workers=2)))

    def train(acc, model, opt, loader, steps):
        seen = []
        for x, idx in loader:
            acc.backward(model(x).sum())
            opt.step()
            opt.zero_grad()
            seen.append(idx.tolist())
            if len(seen) == steps:
                break
        return seen

    straight = train(*setup(), steps=10)
    first = setup()
    seen_a = train(*first, steps=4)
    first[0].save_state(tmp_path / "ckpt")
    second = setup()
    second[0].load_state(tmp_path / "ckpt")
    seen_b = train(*second, steps=6)
    assert seen_a + seen_b == straight
