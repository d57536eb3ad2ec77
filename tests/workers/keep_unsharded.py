"""fsdp_keep_unsharded on a real run: 8 units of Linear(256, 256) + ReLU, AdamW, 4 steps; rank 0 writes how many
of the last units stayed gathered, what the first step measured, which units were still gathered after a training
forward and after an evaluation forward (no_grad), and the losses.

    acc launch --backend fsdp --nproc 2 keep_unsharded.py --out DIR [--batch N]
"""

import argparse

import torch
from common import dump
from torch import nn

from acc import Accelerator


def gathered(units) -> list[int]:
    """The indices of the units whose parameters are gathered (unsharded) now."""
    return [i for i, unit in enumerate(units) if unit._get_fsdp_state()._fsdp_param_group.is_unsharded]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    units = list(model)
    g = torch.Generator().manual_seed(1)
    losses, after_train, after_eval = [], [], []
    for _ in range(4):
        x = torch.randn(args.batch, 256, generator=g)
        loss = model(x).pow(2).mean()
        after_train.append(gathered(units))
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        with torch.no_grad():
            model(x)
        after_eval.append(gathered(units))
    state = accelerator.ctx.backend_state
    dump(args.out, accelerator.process_index, {
        "kept": state.get("keep_unsharded"), "measured": state.get("keep_unsharded_measured"), "losses": losses,
        "after_train": after_train, "after_eval": after_eval})
    accelerator.end_training()


if __name__ == "__main__":
    main()
