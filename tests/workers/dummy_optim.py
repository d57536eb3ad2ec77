"""A DeepSpeed config's optimizer and scheduler through DummyOptim/DummyScheduler, or the same run written with a
real torch AdamW and LambdaLR; each rank writes its losses, the LR of every step and the final weights.

    acc launch --backend deepspeed --nproc 2 --deepspeed-config ds.json dummy_optim.py --out DIR --mode dummy
    acc launch --backend deepspeed --nproc 2 --scheduler-stepping once dummy_optim.py --out DIR --mode real

--via hooks builds the engine by calling the backend's acc_wrap hook directly, as Accelerator.prepare will once it
takes DummyOptim/DummyScheduler (see prepare_through_hooks); --via prepare is the script as a user writes it.
--config-in-code FILE passes the JSON as Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=dict)).
"""

import argparse
import json
import math

import torch
from common import dump
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, DeepSpeedPlugin, set_seed
from acc.state import AcceleratorState
from acc.utils import DummyOptim, DummyScheduler


def warmup_decay(step: int, warmup: int, total: int) -> float:
    """DeepSpeed's WarmupDecayLR factor (linear warmup) after `step` scheduler steps; 0 before the first one."""
    i = step - 1  # the engine's last_batch_iteration
    if i < 0:
        return 0.0
    warmup = max(2, warmup)
    if i < warmup:
        return i / warmup
    return max(0.0, (total - i) / max(1.0, total - warmup))


def prepare_through_hooks(accelerator, model, optimizer, loader, scheduler):
    """What Accelerator.prepare(model, DummyOptim, loader, DummyScheduler) does once the kernel takes the
    placeholders: the loader first, then the model and optimizer through the backend's acc_wrap, then the
    scheduler on the optimizer the backend returned."""
    from acc.runtime.optim import AcceleratedOptimizer

    loader = accelerator.prepare(loader)
    [model], [engine_optimizer] = accelerator._pm.hook.acc_wrap(ctx=accelerator.ctx, models=[model.to(accelerator.device)],
                                                                optimizers=[optimizer])
    prepared = AcceleratedOptimizer(engine_optimizer, accelerator._step_function(engine_optimizer), accelerator.ctx.loop)
    accelerator._models.append(model)
    accelerator._optimizers.append(prepared)
    accelerator._prepared_for[id(optimizer)] = prepared
    return model, prepared, loader, accelerator.prepare_scheduler(scheduler)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=["dummy", "real"], default="dummy")
    p.add_argument("--via", choices=["prepare", "hooks"], default="prepare")
    p.add_argument("--config-in-code")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--start", type=int, default=0, help="batches already trained (with --load)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--total", type=int, default=24, help="DummyScheduler(total_num_steps=...)")
    p.add_argument("--save")
    p.add_argument("--load")
    args = p.parse_args()

    plugin = None
    if args.config_in_code:
        with open(args.config_in_code) as f:
            plugin = DeepSpeedPlugin(hf_ds_config=json.load(f))
    accelerator = Accelerator(deepspeed_plugin=plugin)
    set_seed(0)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2 * args.batch * 12, 6, generator=g)
    y = x @ torch.randn(6, 1, generator=g) + 0.05 * torch.randn(x.shape[0], 1, generator=g)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch)
    if args.mode == "dummy":
        optimizer = DummyOptim(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        scheduler = DummyScheduler(optimizer, total_num_steps=args.total, warmup_num_steps=args.warmup)
    else:  # the same schedule over the optimizer steps, with a real optimizer (launch with --scheduler-stepping once)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                                      betas=(0.9, 0.999), eps=1e-8)
        total = math.ceil(args.total / accelerator.num_processes)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: warmup_decay(k, args.warmup, total))
    ds_view = AcceleratorState().deepspeed_plugin  # what Accelerate scripts read: the config, before and after
    config_before = json.loads(json.dumps(ds_view.deepspeed_config))
    if args.via == "hooks":
        model, optimizer, loader, scheduler = prepare_through_hooks(accelerator, model, optimizer, loader, scheduler)
    else:
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    if args.load:
        accelerator.load_state(args.load)
        loader = accelerator.skip_first_batches(loader, args.start)
    losses, lrs, last_lrs = [], [], []
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        lrs.append(optimizer.param_groups[0]["lr"])  # the LR this step applies
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        last_lrs.append(scheduler.get_last_lr()[0])
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
        if len(losses) == args.steps:
            break
    if args.save:
        accelerator.save_state(args.save)
    inner = getattr(optimizer.optimizer, "optimizer", optimizer.optimizer)  # under ZeRO: the torch optimizer inside
    state = accelerator.get_state_dict(model)
    weights = torch.cat([t.detach().flatten().float() for t in state.values()]) if state else torch.zeros(0)
    dump(args.out, accelerator.process_index, {
        "losses": losses, "lrs": lrs, "last_lrs": last_lrs, "weights": weights.tolist(),
        "optimizer": type(inner).__name__, "weight_decay": optimizer.param_groups[0]["weight_decay"],
        "betas": list(optimizer.param_groups[0]["betas"]), "world": accelerator.num_processes,
        "config_before": config_before, "config_after": json.loads(json.dumps(ds_view.deepspeed_config)),
        "zero_stage": ds_view.zero_stage,
    })
    accelerator.end_training()


if __name__ == "__main__":
    main()
