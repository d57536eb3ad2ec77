"""A script whose own line fails inside a hook: backward of a loss without a graph (the error comes from torch,
through acc's facade, pluggy (with `-p timing` a wrapper too) and the backend's implementation)."""

import torch

from acc import Accelerator


def train(accelerator):
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    loss = model(torch.ones(3, 2)).sum().detach()
    accelerator.backward(loss)  # USER LINE: this loss has no graph


if __name__ == "__main__":
    train(Accelerator())
