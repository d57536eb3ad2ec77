"""Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(...))]), as Accelerate scripts write it;
each rank writes the timeout its process group got.

    acc launch --backend B --nproc 2 pg_timeout.py --out DIR --seconds 77
"""

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist
from common import dump

from acc import Accelerator, InitProcessGroupKwargs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, required=True)
    args = p.parse_args()
    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=args.seconds))])
    group = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    dump(args.out, accelerator.process_index, {"group_timeout": group.options._timeout.total_seconds(),
                                               "setting": accelerator.settings["timeout"],
                                               "source": accelerator.settings.source("timeout")})
    accelerator.end_training()


if __name__ == "__main__":
    main()
