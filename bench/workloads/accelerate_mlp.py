"""The tiny-MLP loop written for Hugging Face Accelerate (launched with torchrun)."""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from mlp_common import BATCH, StepTimer, dataset, model  # noqa: E402


def main() -> None:
    accelerator = Accelerator(cpu=True)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = DataLoader(dataset(), batch_size=BATCH, shuffle=True)
    net, opt, loader = accelerator.prepare(net, opt, loader)
    timer, running = StepTimer(), True
    while running:
        for x, y in loader:
            loss = nn.functional.mse_loss(net(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            if not timer.tick():
                running = False
                break
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
