"""acc deals batches to processes exactly as Accelerate 1.15's BatchSamplerShard does, case by case.

One run of Accelerate (in the reference venv) prints its dealing for a grid of dataset sizes, batch sizes
(fixed and varying), process counts, split_batches, even_batches and drop_last; acc's ShardedBatchSampler
(`last_batch = "fill"`, the default) must yield the same batches and the same len() on every rank.
"""

from __future__ import annotations

import itertools
import json
import subprocess

from torch.utils.data import BatchSampler, SequentialSampler

from acc.runtime.data.samplers import ShardedBatchSampler
from tests.differential.harness import SCRIPTS

CASES = [
    [n, size, world, split, even, drop]
    for n, size, world in itertools.product((1, 3, 7, 8, 16, 17, 23, 40), (None, 2, 4), (2, 3, 4))
    for split, even, drop in itertools.product((False, True), (True, False), (False, True))
    if not (size is None and (split or drop))
]


class Varying(BatchSampler):
    """The same varying batch sizes as the reference script (3, 5, 4, 3, ...)."""

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


def acc_dealing(n, size, world, split, even, drop):
    per_rank = []
    for rank in range(world):
        sampler = Varying(n) if size is None else BatchSampler(SequentialSampler(range(n)), size, drop)
        try:
            shard = ShardedBatchSampler(sampler, world, rank, split_batches=split, even_batches=even)
            per_rank.append({"batches": [list(b) for b in shard], "len": len(shard)})
        except ValueError as exc:
            per_rank.append({"error": type(exc).__name__})
    return per_rank


def test_batches_are_dealt_as_accelerate_deals_them(accelerate_python):
    proc = subprocess.run([str(accelerate_python), str(SCRIPTS / "shard_grid.py"), json.dumps(CASES)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = json.loads(proc.stdout)
    assert len(reference) == len(CASES) > 300
    for case, ref in zip(CASES, reference):
        mine = acc_dealing(*case)
        for rank, (r, m) in enumerate(zip(ref, mine)):
            assert r.get("error") == m.get("error"), (case, rank, r, m)
            assert r.get("batches") == m.get("batches"), f"case {case} rank {rank}: Accelerate {r}, acc {m}"
            if "batches" in m:
                assert m["len"] == len(m["batches"]), f"case {case} rank {rank}: len() {m['len']} != yielded"
                if r["len"] == len(r["batches"]):  # where Accelerate's len() is right, it is the same
                    assert m["len"] == r["len"], (case, rank)
