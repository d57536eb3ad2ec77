"""Evaluate over a dataset of sample ids; each rank records gather_for_metrics' result per epoch.

    acc launch --backend ddp --nproc N eval_gather.py --out DIR --samples 82 --batch 16 [--shuffle] [--iterable]
        [--rank-seeded-generator]
"""

import argparse

import torch
from common import dump
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from acc import Accelerator


class Stream(IterableDataset):
    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(torch.arange(self.n))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=82)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--iterable", action="store_true")
    p.add_argument("--rank-seeded-generator", action="store_true", help="each rank's own DataLoader generator seed")
    args = p.parse_args()

    accelerator = Accelerator()
    dataset = Stream(args.samples) if args.iterable else TensorDataset(torch.arange(args.samples))
    generator = torch.Generator().manual_seed(100 + accelerator.process_index) if args.rank_seeded_generator else None
    loader = accelerator.prepare(DataLoader(dataset, batch_size=args.batch, shuffle=args.shuffle, generator=generator))
    gathered, mine, objects, steps = [], [], [], 0
    for _ in range(args.epochs):
        epoch_gathered, epoch_mine, epoch_objects = [], [], []
        for batch in loader:
            steps += 1
            ids = batch if args.iterable else batch[0]
            epoch_mine.extend(ids.tolist())
            epoch_gathered.extend(accelerator.gather_for_metrics(ids).tolist())
            epoch_objects.extend(accelerator.gather_for_metrics([f"id{i}" for i in ids.tolist()],
                                                                use_gather_object=True))
        gathered.append(epoch_gathered)
        mine.append(epoch_mine)
        objects.append(epoch_objects)
    dump(args.out, accelerator.process_index, {"gathered": gathered, "mine": mine, "objects": objects,
                                               "steps": steps, "len": None if args.iterable else len(loader), "world": accelerator.num_processes})
    accelerator.end_training()


if __name__ == "__main__":
    main()
