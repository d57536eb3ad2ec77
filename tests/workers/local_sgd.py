"""LocalSGD on the ddp backend: each rank trains on its own data; rank files record the parameters before and
after each `local_sgd.step()` and after the block.

    acc launch --backend ddp --nproc 2 local_sgd.py --out DIR --every 3 --steps 7 [--disabled]
"""

import argparse

import torch
from common import dump
from torch import nn

from acc import Accelerator
from acc.local_sgd import LocalSGD


def flat(model) -> list:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--disabled", action="store_true")
    args = p.parse_args()
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    g = torch.Generator().manual_seed(100 + accelerator.process_index)  # different data on each rank
    steps = []
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=args.every,
                  enabled=not args.disabled) as local_sgd:
        for _ in range(args.steps):
            x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            before = flat(model)
            local_sgd.step()
            steps.append({"before": before, "after": flat(model)})
    dump(args.out, accelerator.process_index, {"steps": steps, "final": flat(model), "enabled": local_sgd.enabled,
                                               "num_steps": local_sgd.num_steps})
    accelerator.end_training()


if __name__ == "__main__":
    main()
