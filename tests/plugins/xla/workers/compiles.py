"""Train on the xla backend and record torch-xla's compile counter as each step's graph runs.

    acc launch --backend xla compiles.py --out DIR [--steps 20] [--opt sgd|adam] [--dropout P]
Writes rank<N>.json: `compiles[k]` = graphs compiled before step k was traced (so after step k-1 ran),
the last entry after the final step ran; `losses` per step; `cached` = compilations served from the cache.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch_xla.debug.metrics as met
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "workers"))
from common import dump  # noqa: E402

from acc import Accelerator, set_seed  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--opt", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--mixed-precision", default=None)
    args = p.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(0)
    g = torch.Generator().manual_seed(7)
    n = args.steps * args.batch
    data = TensorDataset(torch.randn(n, 6, generator=g), torch.randn(n, 1, generator=g))
    model = nn.Sequential(nn.Linear(6, 32), nn.Dropout(args.dropout), nn.Tanh(), nn.Linear(32, 1))
    opt = (torch.optim.SGD(model.parameters(), lr=0.05) if args.opt == "sgd"
           else torch.optim.Adam(model.parameters(), lr=0.01))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    compiles, losses = [], []
    for x, y in loader:  # fetching a batch cuts and runs the previous step's graph
        compiles.append(met.counter_value("UncachedCompile") or 0)
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    compiles.append(met.counter_value("UncachedCompile") or 0)  # the loader cut the last step at its end
    dump(args.out, accelerator.process_index, {
        "compiles": compiles, "losses": [float(v) for v in losses], "cached": met.counter_value("CachedCompile") or 0,
        "device": str(accelerator.device), "x_device": str(x.device),
    })
    accelerator.end_training()


if __name__ == "__main__":
    main()
