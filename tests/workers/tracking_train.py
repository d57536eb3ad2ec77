"""A small training loop that logs through Accelerate's tracking API (log_with, init_trackers, log, trackers,
get_tracker, end_training), as an Accelerate script would. Each rank writes what it saw to OUT/rank<N>.json.

    python tracking_train.py --out OUT --project-dir DIR --log-with all [--steps 5] [--init-kwargs JSON] [--save DIR]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from acc import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--project-dir", default=None)
parser.add_argument("--log-with", default="all", help="comma-separated names; 'setting': leave it to ACC_LOG_WITH")
parser.add_argument("--project", default="demo")
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--init-kwargs", default="{}")
parser.add_argument("--save", default=None, help="save_state here after training")
args = parser.parse_args()

log_with = None if args.log_with == "setting" else args.log_with.split(",")
accelerator = Accelerator(log_with=log_with, project_dir=args.project_dir)
config = {"lr": args.lr, "steps": args.steps, "layers": [4, 1], "scheduler": None, "optimizer": "sgd"}
accelerator.init_trackers(args.project, config=config, init_kwargs=json.loads(args.init_kwargs))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
model, optimizer = accelerator.prepare(model, optimizer)
x = torch.linspace(-1, 1, 24).reshape(8, 3)
y = x.sum(dim=1, keepdim=True)
losses = []
for step in range(args.steps):
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    mean_loss = accelerator.reduce(loss.detach(), "mean")  # the same number on every rank
    losses.append(mean_loss.item())
    # a 0-d tensor, a Python float, a string, and a value no scalar tracker stores (a 3-element tensor)
    accelerator.log({"loss": mean_loss, "lr": args.lr, "phase": "train", "weights": torch.ones(3)}, step=step)

# what diffusers' scripts do with Accelerate's trackers: reach the library object by the tracker's name
for tracker in accelerator.trackers:
    if tracker.name == "tensorboard":
        tracker.writer.add_text("sample", "a validation sample", 0)
    elif tracker.name == "wandb":
        tracker.log({"validation_note": "a validation sample"}, step=args.steps - 1)

record = {
    "rank": accelerator.process_index,
    "losses": losses,
    "trackers": [t.name for t in accelerator.trackers],
    "log_with": [t if isinstance(t, str) else t.name for t in accelerator.log_with],
    "unwrapped": {t.name: type(accelerator.get_tracker(t.name, unwrap=True)).__name__ for t in accelerator.trackers},
    "blank": type(accelerator.get_tracker("jsonl")).__name__ if not accelerator.trackers else None,
}
if args.save:
    accelerator.save_state(args.save)
accelerator.end_training()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
(out / f"rank{record['rank']}.json").write_text(json.dumps(record))
print(f"rank {record['rank']} done, pid {os.getpid()}")
