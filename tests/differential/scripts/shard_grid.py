"""Print, as JSON, how Accelerate 1.15 deals batches to processes over a grid of cases (run with its venv).

Each case: dataset size, batch size (None: varying sizes), processes, split_batches, even_batches, drop_last;
for each rank, the lists of indices its BatchSamplerShard yields and its len().
"""

import json
import sys

from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import BatchSampler, SequentialSampler


class Varying(BatchSampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        start, k = 0, 0
        while start < self.n:
            size = (3, 5, 4)[k % 3]
            yield list(range(start, min(self.n, start + size)))
            start, k = start + size, k + 1

    def __len__(self):
        return len(list(iter(self)))


def main():
    out = []
    for case in json.loads(sys.argv[1]):
        n, size, world, split, even, drop = case
        per_rank = []
        for rank in range(world):
            sampler = Varying(n) if size is None else BatchSampler(SequentialSampler(range(n)), size, drop)
            try:
                shard = BatchSamplerShard(sampler, world, rank, split_batches=split, even_batches=even)
                per_rank.append({"batches": [list(b) for b in shard], "len": len(shard)})
            except ValueError as exc:
                per_rank.append({"error": type(exc).__name__})
        out.append(per_rank)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
