"""acc.local_sgd.LocalSGD in one process (the 2-process behaviour: tests/plugins/ddp/test_comm_hook_local_sgd.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn


def test_local_sgd_does_nothing_on_one_process():
    from acc import Accelerator
    from acc.local_sgd import LocalSGD

    assert LocalSGD.__module__ == "acc.local_sgd"
    accelerator = Accelerator()
    model = accelerator.prepare(nn.Linear(2, 1))
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=2) as local_sgd:
        assert local_sgd.enabled is False
        for _ in range(3):
            local_sgd.step()
    assert local_sgd.num_steps == 3 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="local_sgd_steps"):
        LocalSGD(accelerator, model, 0)


def test_local_sgd_refuses_sharded_backends():
    from acc.local_sgd import LocalSGD

    class Sharded:  # what LocalSGD reads of an Accelerator running the fsdp backend
        distributed_type = "fsdp"
        num_processes = 2

    with pytest.raises(NotImplementedError, match="'fsdp'"):
        LocalSGD(Sharded(), nn.Linear(1, 1), 2)
