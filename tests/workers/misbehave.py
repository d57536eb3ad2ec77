"""A training loop in which one rank misbehaves at a chosen step.

    acc launch --backend ddp --nproc 2 misbehave.py --mode raise|sigkill|hang|run --rank 1 --step 3 --out DIR
Every rank prints a line per step ("rank R step S"); DIR gets marker files for the test to read.
"""

import argparse
import logging
import os
import signal
import time
from pathlib import Path

import torch

from acc import Accelerator, get_logger


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=["raise", "sigkill", "hang", "run", "fail-once"])
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--step", type=int, default=3)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator()
    rank = accelerator.process_index
    (out / f"pid{rank}").write_text(str(os.getpid()))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger = get_logger("misbehave")
    logger.info("logger line from rank %d", rank)
    logger.info("every rank logs this, rank %d", rank, main_process_only=False)
    for step in range(args.steps):
        print(f"rank {rank} step {step}", flush=True)
        if step == args.step and rank == args.rank:
            (out / "misbehaved_at").write_text(str(time.time()))
            if args.mode == "raise":
                raise ValueError("boom")
            if args.mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if args.mode == "hang":
                time.sleep(3600)
        accelerator.reduce(torch.ones(1), "sum")
        if args.mode == "run":
            time.sleep(0.05)  # a steady pace: a long run lasts until the test stops it
    accelerator.end_training()


if __name__ == "__main__":
    main()
