"""Accumulation, clipping and scheduling facts per micro-step; each rank writes what it saw.

    acc launch [--backend ddp --nproc 2] loop_semantics.py --out DIR --batch 4 --accum 3 [--clip 1.0]
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
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--clip", type=float, default=0.0)
    p.add_argument("--mixed-precision", default=None)
    p.add_argument("--report-compiled", action="store_true")
    args = p.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=args.accum, mixed_precision=args.mixed_precision)
    set_seed(0)
    g = torch.Generator().manual_seed(99)
    data = TensorDataset(torch.randn(args.samples, 5, generator=g), torch.randn(args.samples, 1, generator=g))
    model = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True)
    model, opt, sched, loader = accelerator.prepare(model, opt, sched, loader)
    grads, syncs, lrs, norms = [], [], [], []
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            grads.append([float(p.grad.sum()) if p.grad is not None else None for p in model.parameters()])
            syncs.append(accelerator.sync_gradients)
            if args.clip and accelerator.sync_gradients:
                norms.append(float(accelerator.clip_grad_norm_(model.parameters(), args.clip)))
            opt.step()
            sched.step()
            opt.zero_grad()
            if accelerator.sync_gradients:
                lrs.append(sched.get_last_lr()[0])
    state = accelerator.get_state_dict(model)  # whole on process 0 even when the backend shards
    weights = torch.cat([t.detach().flatten().float() for t in state.values()]) if state else torch.zeros(0)
    dump(args.out, accelerator.process_index, {"weights": weights.tolist(), "grads": grads, "syncs": syncs,
                                               "lrs": lrs, "norms": norms, "steps": accelerator.applied_steps,
                                               "compiled": hasattr(model, "_orig_mod")})
    accelerator.end_training()


if __name__ == "__main__":
    main()
