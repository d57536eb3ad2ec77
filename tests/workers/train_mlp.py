"""Train a small MLP on fixed data; rank 0 writes the final weights (and each rank its sample order).

    acc launch [--backend ddp --nproc 2] train_mlp.py --out DIR --batch 8 [--shuffle] [--epochs 1]
"""

import argparse

import torch
from common import dump
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, set_seed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args()

    accelerator = Accelerator()
    set_seed(args.seed)
    g = torch.Generator().manual_seed(1234)
    data = TensorDataset(torch.randn(args.samples, 6, generator=g), torch.randn(args.samples, 1, generator=g),
                         torch.arange(args.samples))
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader = DataLoader(data, batch_size=args.batch, shuffle=args.shuffle)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    seen, losses = [], []
    for _ in range(args.epochs):
        for x, y, idx in loader:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            seen.append(idx.tolist())
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
    weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    dump(args.out, accelerator.process_index, {
        "weights": weights.tolist(), "seen": seen, "losses": losses, "world": accelerator.num_processes,
        "backend": accelerator.backend, "device": str(accelerator.device),
    })
    accelerator.end_training()


if __name__ == "__main__":
    main()
