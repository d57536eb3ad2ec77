"""Fails once at a given step (first attempt only), after saving checkpoints; the restarted attempt resumes.

    acc launch --backend ddp --nproc 2 --max-restarts 1 restartable.py --project DIR --steps 6 --fail-at 4
"""

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, set_seed
from acc.checkpointing.files import ProjectConfiguration


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--project", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--fail-at", type=int, default=4)
    args = p.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    config = ProjectConfiguration(project_dir=args.project, automatic_checkpoint_naming=True)
    acc = Accelerator(project_config=config)
    set_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(64, 3), torch.randn(64, 1)), batch_size=4)
    model, opt, loader = acc.prepare(model, opt, loader)
    if (config.checkpoints_dir).exists():
        acc.load_state()  # the newest complete checkpoint
    acc.print(f"attempt {attempt} starts at step {acc.applied_steps}")
    for x, y in loader:
        if acc.applied_steps >= args.steps:
            break
        if attempt == 0 and acc.applied_steps == args.fail_at and acc.process_index == 1:
            raise RuntimeError("simulated crash")
        acc.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        acc.save_state()
    acc.print(f"finished {acc.applied_steps} steps")
    acc.end_training()


if __name__ == "__main__":
    main()
