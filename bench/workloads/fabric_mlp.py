"""The tiny-MLP loop written for Lightning Fabric (launched with torchrun)."""

import os
import sys
from pathlib import Path

import torch
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from mlp_common import BATCH, StepTimer, dataset, model  # noqa: E402


def main() -> None:
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]))
    fabric.launch()
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    net, opt = fabric.setup(net, opt)
    loader = fabric.setup_dataloaders(DataLoader(dataset(), batch_size=BATCH, shuffle=True))
    timer, running, epoch = StepTimer(), True, 0
    while running:
        loader.sampler.set_epoch(epoch) if hasattr(loader.sampler, "set_epoch") else None
        for x, y in loader:
            loss = nn.functional.mse_loss(net(x), y)
            fabric.backward(loss)
            opt.step()
            opt.zero_grad()
            if not timer.tick():
                running = False
                break
        epoch += 1
    fabric.barrier()


if __name__ == "__main__":
    main()
