"""Where each rank of a multi-machine run runs, and a run to lose a machine in.

    acc launch ... --num-machines 2 --machine-rank K machines.py --out DIR [--mode run|sleep] [--steps N]
Every rank writes DIR/rank<R>.json (its global rank, the --machine-rank of its launcher, its pid, its launcher's
pid, its parent's name) before training. run: N all-reduces; sleep: one all-reduce, then an hour without any collective; loop: an all-reduce
every 50 ms for ever; raise: rank 2 raises after the first all-reduce.
"""

import argparse
import json
import os
import time

import torch
from common import dump

from acc import Accelerator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", default="run", choices=["run", "sleep", "loop", "raise"])
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    accelerator = Accelerator()
    launch = json.loads(os.environ["ACC_LAUNCH"])["values"]
    total = accelerator.reduce(torch.ones(1), "sum")
    dump(args.out, accelerator.process_index, {
        "rank": accelerator.process_index, "world": accelerator.num_processes,
        "machine_rank": launch["machine_rank"], "local_rank": accelerator.local_process_index,
        "pid": os.getpid(), "launcher": os.getppid(), "main": accelerator.is_main_process, "sum": total.item(),
        "parent": open(f"/proc/{os.getppid()}/comm").read().strip()})
    if args.mode == "sleep":
        time.sleep(3600)
    if args.mode == "raise" and accelerator.process_index == 2:  # the first process of machine 1
        raise ValueError("boom on machine 1")
    while args.mode == "loop":  # a collective every 50 ms, for ever
        accelerator.reduce(torch.ones(1), "sum")
        time.sleep(0.05)
    for _ in range(args.steps):
        accelerator.reduce(torch.ones(1), "sum")
    accelerator.end_training()


if __name__ == "__main__":
    main()
