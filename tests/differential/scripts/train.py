"""A training script written for Hugging Face Accelerate, the way its examples are written.

The differential tests run it unchanged with Accelerate 1.15 and, with only its imports changed, with acc,
and compare what every rank wrote: the sample ids and learning rate of every step, the loss, the final
weights and optimizer state, and the gathered evaluation.

    python train.py --out DIR [--epochs 2] [--accum 2] [--clip] [--mixed-precision bf16] ...
"""

import argparse
import json
import math
import os

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler

FEATURES, CLASSES = 8, 4


def make_data(n: int, seed: int = 1234):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    y = (x @ w).argmax(1)
    return x, y


class Samples(Dataset):
    """(id, features, label): the id lets the test see which samples every step trained on."""

    def __init__(self, n: int, seed: int = 1234):
        self.x, self.y = make_data(n, seed)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.tensor(i), self.x[i], self.y[i]


class Stream(IterableDataset):
    def __init__(self, n: int, sized: bool):
        self.data = Samples(n)
        self.sized = sized

    def __iter__(self):
        for i in range(len(self.data)):
            yield self.data[i]

    def __len__(self):
        if not self.sized:
            raise TypeError("a stream of unknown length")
        return len(self.data)


class ChunkedBatches(BatchSampler):
    """A user's batch sampler: batches of varying size (sizes cycle through 3, 5, 4)."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        sizes, start, k = (3, 5, 4), 0, 0
        while start < self.n:
            size = sizes[k % 3]
            yield list(range(start, min(self.n, start + size)))
            start, k = start + size, k + 1

    def __len__(self):
        count, start, k = 0, 0, 0
        while start < self.n:
            start, k, count = start + (3, 5, 4)[k % 3], k + 1, count + 1
        return count


def build_loaders(args):
    common = {"num_workers": args.workers}
    if args.data == "iterable" or args.data == "iterable-sized":
        train = DataLoader(Stream(args.samples, args.data == "iterable-sized"), batch_size=args.batch_size,
                           drop_last=args.drop_last, **common)
    elif args.data == "batch-sampler":
        train = DataLoader(Samples(args.samples), batch_sampler=ChunkedBatches(args.samples), **common)
    elif args.data == "sampler-is-batch-sampler":  # batch_size=None with a BatchSampler as the sampler
        sampler = BatchSampler(RandomSampler(range(args.samples)) if args.shuffle else
                               SequentialSampler(range(args.samples)), args.batch_size, drop_last=args.drop_last)
        train = DataLoader(Samples(args.samples), sampler=sampler, batch_size=None, **common)
    else:
        train = DataLoader(Samples(args.samples), batch_size=args.batch_size, shuffle=args.shuffle,
                           drop_last=args.drop_last, **common)
    evaluation = DataLoader(Samples(args.eval_samples, seed=99), batch_size=args.eval_batch_size)
    return train, evaluation


class Net(nn.Module):
    def __init__(self, dropout: float):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, CLASSES))

    def forward(self, x):
        return self.body(x)


def adam_state(optimizer):
    """Adam's first moments, when the optimizer keeps them as plain tensors (not under a sharding backend)."""
    try:
        state = optimizer.state_dict()["state"]
        return [s["exp_avg"].flatten().tolist() for _, s in sorted(state.items())]
    except (KeyError, RuntimeError, TypeError, AttributeError):
        return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=42)
    p.add_argument("--eval-samples", type=int, default=13)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--eval-batch-size", type=int, default=4)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--clip", type=float, default=0.0)
    p.add_argument("--mixed-precision", default="no")
    p.add_argument("--data", default="map", choices=["map", "iterable", "iterable-sized", "batch-sampler",
                                                     "sampler-is-batch-sampler"])
    p.add_argument("--no-shuffle", dest="shuffle", action="store_false")
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--split-batches", action="store_true")
    p.add_argument("--uneven", action="store_true", help="DataLoaderConfiguration(even_batches=False)")
    p.add_argument("--seedable", action="store_true", help="DataLoaderConfiguration(use_seedable_sampler=True)")
    p.add_argument("--no-dispatch", action="store_true", help="DataLoaderConfiguration(dispatch_batches=False)")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--scheduler", default="linear", choices=["linear", "onecycle", "none"])
    p.add_argument("--step-scheduler-with-optimizer", type=int, default=1)
    p.add_argument("--save-at", type=int, default=-1, help="save_state after this many batches (then stop)")
    p.add_argument("--resume", help="load_state from this directory, then skip the batches already trained")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()

    config = DataLoaderConfiguration(split_batches=args.split_batches, even_batches=not args.uneven,
                                     use_seedable_sampler=args.seedable,
                                     dispatch_batches=False if args.no_dispatch else None)
    accelerator = Accelerator(cpu=True, mixed_precision=args.mixed_precision, gradient_accumulation_steps=args.accum,
                              dataloader_config=config,
                              step_scheduler_with_optimizer=bool(args.step_scheduler_with_optimizer))
    set_seed(args.seed)
    train_dl, eval_dl = build_loaders(args)
    model = Net(args.dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    # sized from the loader before prepare, as Accelerate's own examples do
    try:
        per_epoch = len(train_dl)
    except TypeError:
        per_epoch = math.ceil(args.samples / args.batch_size)
    total = per_epoch * args.epochs // args.accum
    if args.scheduler == "linear":
        warmup = max(1, total // 10)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: s / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
    elif args.scheduler == "onecycle":
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=total)
    else:
        scheduler = None
    objects = [model, optimizer, train_dl, eval_dl] + ([scheduler] if scheduler else [])
    prepared = accelerator.prepare(*objects)
    model, optimizer, train_dl, eval_dl = prepared[:4]
    scheduler = prepared[4] if scheduler else None

    steps = []
    start_epoch, skip = 0, 0
    if args.resume:
        accelerator.load_state(args.resume)
        with open(os.path.join(args.resume, "position.json")) as fp:
            position = json.load(fp)
        start_epoch, skip = position["epoch"], position["batches"]
    seen = 0
    for epoch in range(start_epoch, args.epochs):
        model.train()
        loader = train_dl
        if skip:
            loader = accelerator.skip_first_batches(train_dl, skip)
        for step, (ids, x, y) in enumerate(loader, start=skip):
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                norm = None
                if args.clip and accelerator.sync_gradients:
                    norm = accelerator.clip_grad_norm_(model.parameters(), args.clip)
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                optimizer.zero_grad()
            lr = optimizer.param_groups[0]["lr"]
            steps.append({"epoch": epoch, "step": step, "ids": ids.tolist(), "lr": lr, "loss": loss.item(),
                          "sync": accelerator.sync_gradients, "norm": None if norm is None else float(norm),
                          "skipped": accelerator.optimizer_step_was_skipped})
            seen += 1
            if seen == args.save_at:
                accelerator.save_state(os.path.join(args.out, "ckpt"))
                if accelerator.is_main_process:
                    with open(os.path.join(args.out, "ckpt", "position.json"), "w") as fp:
                        json.dump({"epoch": epoch, "batches": step + 1}, fp)
                accelerator.wait_for_everyone()
                break
        else:
            skip = 0
            continue
        break

    model.eval()
    gathered_ids, correct = [], 0
    with torch.no_grad():
        for ids, x, y in eval_dl:
            preds = model(x).argmax(-1)
            all_ids, all_preds, all_y = accelerator.gather_for_metrics((ids, preds, y))
            gathered_ids += all_ids.tolist()
            correct += (all_preds == all_y).sum().item()
    weights = accelerator.get_state_dict(model)  # whole on the main process, also when a backend shards
    result = {
        "steps": steps,
        "weights": {k: v.flatten().tolist() for k, v in weights.items()} if accelerator.is_main_process else {},
        "exp_avg": adam_state(optimizer),
        "eval_ids": gathered_ids,
        "accuracy": correct / max(1, len(gathered_ids)),
        "num_processes": accelerator.num_processes,
        "accelerator_step": accelerator.step,
        "rng_after": torch.rand(3).tolist(),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{accelerator.process_index}.json"), "w") as fp:
        json.dump(result, fp)
    # Accelerate 1.15's end_training destroys the gloo process group without waiting for the other ranks;
    # without this barrier 3 of 8 of its 2-process runs aborted at exit (SIGABRT) after writing their records
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
