"""Baseline: a hand-written torch DDP loop, launched with torchrun."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).parent))
from mlp_common import BATCH, StepTimer, dataset, model  # noqa: E402


def main() -> None:
    dist.init_process_group("gloo")
    data = dataset()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    net = nn.parallel.DistributedDataParallel(model())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    timer, epoch, running = StepTimer(), 0, True
    while running:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if not timer.tick():
                running = False
                break
        epoch += 1
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
