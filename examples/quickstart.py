"""A small classifier trained with acc; runs unchanged on any backend.

    acc launch examples/quickstart.py
    acc launch --backend ddp --nproc 2 examples/quickstart.py --epochs 5

The data are two interleaved spirals generated from a fixed seed, so every run sees the same data.
"""

import argparse
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, set_seed


def spirals(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * 3 * math.pi
    label = torch.randint(0, 2, (n,), generator=g)
    r = t / (3 * math.pi)
    angle = t + label * math.pi
    x = torch.stack([r * torch.cos(angle), r * torch.sin(angle)], dim=1)
    x += 0.02 * torch.randn(x.shape, generator=g)
    return TensorDataset(x, label)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.03)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    accelerator = Accelerator()
    set_seed(args.seed)
    train = DataLoader(spirals(2048, seed=1), batch_size=args.batch_size, shuffle=True)
    test = DataLoader(spirals(500, seed=2), batch_size=64)
    model = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model, optimizer, train, test = accelerator.prepare(model, optimizer, train, test)
    accelerator.print(f"training on {accelerator.num_processes} process(es), backend {accelerator.backend}, "
                      f"device {accelerator.device}")

    for epoch in range(args.epochs):
        model.train()
        total, count = torch.zeros((), device=accelerator.device), 0
        for x, y in train:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total += loss.detach()
            count += 1
        mean_loss = accelerator.reduce(total / count, reduction="mean").item()

        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for x, y in test:
                pred = model(x).argmax(dim=1)
                pred, y = accelerator.gather_for_metrics((pred, y))
                correct += (pred == y).sum().item()
                seen += y.numel()
        accelerator.print(f"epoch {epoch}: train loss {mean_loss:.4f}, test accuracy {correct / seen:.3f} "
                          f"({seen} samples)")
    accelerator.end_training()


if __name__ == "__main__":
    main()
