"""A run to list the listening sockets of: every rank trains one step (its process group connected), writes
DIR/rank<R>.json, then waits (at most --wait seconds) for DIR/go before it ends.

    acc launch --backend {ddp,fsdp,deepspeed} --nproc 2 listening.py --out DIR
"""

import argparse
import os

import torch
from common import dump

from acc import Accelerator
from tests.waiting import wait_for_paths


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--wait", type=float, default=120.0)
    args = p.parse_args()
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(16, 8))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    (x,) = next(iter(loader))
    loss = model(x).float().pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    total = accelerator.reduce(torch.ones(1, device=accelerator.device), "sum").item()
    dump(args.out, accelerator.process_index, {"rank": accelerator.process_index, "pid": os.getpid(), "sum": total,
                                               "gloo": os.environ.get("GLOO_SOCKET_IFNAME")})
    wait_for_paths([os.path.join(args.out, "go")], args.wait)
    accelerator.end_training()


if __name__ == "__main__":
    main()
