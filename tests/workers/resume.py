"""Train with Adam, dropout and a shuffled loader; optionally save or resume a checkpoint mid-epoch.

    acc launch ... resume.py --out DIR --steps 10 [--save CKPT] [--load CKPT] [--auto PROJECT] [--big-mb N]
Each rank writes its final weights, Adam state and the sample ids of every step it ran.
"""

import argparse
import os

import torch
from common import dump
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, set_seed
from acc.checkpointing.files import ProjectConfiguration


class Counter:
    """A registered object: counts steps; optionally carries a large tensor to make saving slow."""

    def __init__(self, big_mb: int = 0):
        self.count = 0
        self.blob = torch.zeros(big_mb * 2**18) if big_mb else None  # big_mb MiB of float32

    def state_dict(self):
        return {"count": self.count, **({"blob": self.blob} if self.blob is not None else {})}

    def load_state_dict(self, state):
        self.count = state["count"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save")
    p.add_argument("--load")
    p.add_argument("--auto", help="project dir: automatic checkpoint naming")
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--total-limit", type=int, default=None)
    p.add_argument("--big-mb", type=int, default=0)
    p.add_argument("--pid-file")
    args = p.parse_args()

    config = ProjectConfiguration(project_dir=args.auto, automatic_checkpoint_naming=bool(args.auto),
                                  total_limit=args.total_limit)
    accelerator = Accelerator(project_config=config)
    if args.pid_file and accelerator.is_main_process:
        with open(args.pid_file, "w") as fp:
            fp.write(str(os.getpid()))
    set_seed(0)
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(50, 6, generator=g), torch.randn(50, 1, generator=g), torch.arange(50))
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model, opt, sched, loader = accelerator.prepare(model, opt, sched, loader)
    counter = Counter(args.big_mb)
    accelerator.register_for_checkpointing(counter)
    if args.load:
        accelerator.load_state(None if args.load == "auto" else args.load)
    seen, done = [], 0
    while done < args.steps:
        for x, y, idx in loader:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            counter.count += 1
            seen.append(idx.tolist())
            done += 1
            if args.save_every and done % args.save_every == 0:
                accelerator.save_state()
            if done == args.steps:
                break
    if args.save:
        accelerator.save_state(None if args.save == "auto" else args.save)
    state = opt.state_dict()["state"]
    dump(args.out, accelerator.process_index, {
        "weights": [p.detach().flatten().tolist() for p in accelerator.unwrap_model(model).parameters()],
        "adam": [[s["exp_avg"].flatten().tolist(), s["exp_avg_sq"].flatten().tolist()] for _, s in sorted(state.items())],
        "seen": seen, "count": counter.count, "lr": sched.get_last_lr(), "step": accelerator.applied_steps,
        "rand": torch.rand(3).tolist(),
    })
    accelerator.end_training()


if __name__ == "__main__":
    main()
