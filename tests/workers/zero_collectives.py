"""Under the deepspeed backend, DeepSpeed's own collective calls (what ZeRO calls) with acc's p2p collectives in
place, against torch.distributed's on the same tensors; each rank records what it got.

    acc launch --backend deepspeed --nproc 3 [--zero-collectives p2p|native] zero_collectives.py --out DIR
"""

import argparse

import torch
import torch.distributed as dist
from common import dump

from acc import Accelerator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    accelerator = Accelerator()
    from deepspeed import comm

    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    shard = torch.randn(1001, generator=g)
    gathered = torch.empty(world * 1001)
    comm.all_gather_into_tensor(gathered, shard, async_op=True).wait()  # ZeRO-3's parameter gathers: asynchronous
    in_place = torch.zeros(world * 1001)
    in_place[rank * 1001:(rank + 1) * 1001] = shard
    comm.allgather_fn(in_place, in_place[rank * 1001:(rank + 1) * 1001])
    expected = [torch.empty(1001) for _ in range(world)]
    dist.all_gather(expected, shard)
    grads = torch.randn(world * 500, generator=g)
    summed = torch.empty(500)
    comm.reduce_scatter_fn(summed, grads.clone())  # ZeRO's gradient reduce-scatter (SUM)
    averaged = torch.empty(500)
    comm.reduce_scatter_fn(averaged, grads.clone(), op=comm.ReduceOp.AVG)
    total = grads.clone()
    dist.all_reduce(total)
    mine = total.view(world, 500)[rank]
    dump(args.out, rank, {
        "p2p": getattr(comm.comm.cdb, "_acc_p2p", False),
        "gather_error": (gathered - torch.cat(expected)).abs().max().item(),
        "in_place_error": (in_place - torch.cat(expected)).abs().max().item(),
        "sum_error": (summed - mine).abs().max().item(),
        "avg_error": (averaged - mine / world).abs().max().item(),
    })
    accelerator.end_training()


if __name__ == "__main__":
    main()
