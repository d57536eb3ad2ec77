"""A checkpoint written by one library's save_state, read by the other's load_state; written for Accelerate.

    python checkpoint_interop.py --out DIR --save CKPT [--unsafe]   # train, save_state, record what follows
    python checkpoint_interop.py --out DIR --load CKPT              # fresh objects, load_state, record the same

After a save the record holds the state just saved and the draws that follow it; after a load, the restored state
and the draws that follow the load: equal records mean everything was restored.
"""

import argparse
import json
import os
import random

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn


class Counter:
    """A registered object: its state is tensors and plain data."""

    def __init__(self):
        self.seen, self.total = 0, torch.zeros(2)

    def state_dict(self):
        return {"seen": self.seen, "total": self.total}

    def load_state_dict(self, state):
        self.seen, self.total = state["seen"], state["total"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--save")
    p.add_argument("--load")
    p.add_argument("--unsafe", action="store_true")
    args = p.parse_args()
    accelerator = Accelerator(cpu=True)
    set_seed(11 if args.save else 99)  # the loading side starts from other weights
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9 ** step)
    counter = Counter()
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.register_for_checkpointing(counter)
    if args.save:
        for step in range(3):
            x = torch.randn(5, 4)
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            counter.seen, counter.total = counter.seen + 1, counter.total + x[:, :2].sum(0)
            accelerator.step += 1
        accelerator.save_state(args.save, safe_serialization=not args.unsafe)
    else:
        accelerator.load_state(args.load)
    state = accelerator.unwrap_model(model).state_dict()
    moments = optimizer.state_dict()["state"]
    record = {
        "weights": {k: v.tolist() for k, v in state.items()},
        "exp_avg": {str(k): v["exp_avg"].tolist() for k, v in moments.items()},
        "optimizer_steps": {str(k): float(v["step"]) for k, v in moments.items()},
        "lr": scheduler.get_last_lr(),
        "scheduler_epoch": scheduler.scheduler.last_epoch if hasattr(scheduler, "scheduler") else scheduler.last_epoch,
        "counter": [counter.seen, counter.total.tolist()],
        "step": accelerator.step,
        "draws": [torch.rand(3).tolist(), random.random(), float(np.random.rand())],
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rank0.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
