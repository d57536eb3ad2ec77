"""The pieces of a sharded step on the bench model (sharded_step.py's 8 x Linear(2500, 2500), batch 8, AdamW),
timed apart on every rank at once (the processes contend for the cores as in a real step), with plain torch and
raw torch.distributed on acc's gloo group:
  compute_full       forward + backward + AdamW over all parameters, no communication (ddp's local work)
  compute_sharded    forward + backward + AdamW over flat shards of 1/W of each unit (fsdp's and ZeRO-3's local work)
  allreduce          all_reduce of the whole gradient in 25 MB buckets (DDP's default bucket size)
  allgather          gloo's all_gather_single (FSDP2's native call) of each unit from its 1/W shard, the 8 units
  allgather_p2p      the same all-gather with acc's fsdp p2p all-gather (isend/irecv with every peer)
  reduce_scatter_all_to_all  per unit, acc_fsdp.tuning.all_to_all_reduce_scatter (all_to_all_single + a local sum)
  reduce_scatter_p2p the same with acc's fsdp p2p reduce-scatter (isend/irecv, then the sum in rank order)
The p2p collectives are acc_fsdp.tuning's own objects, called as FSDP2 calls them. Each figure is the median over
`--repeats` (after one warm-up), seconds per step, with barriers around every timed section; the sections are
interleaved within each repeat so drift affects all alike. Prints one BENCH line on rank 0. Launched with
`acc launch --backend ddp --nproc 2`."""

import argparse
import json
import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from acc import Accelerator
from acc_fsdp import tuning

WIDTH, LAYERS, BATCH, BUCKET_BYTES = 2500, 8, 8, 25 * 1024 * 1024


def timed(fn: Callable[[], None]) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    accelerator = Accelerator()  # only for the gloo process group, the rank and the world size
    world = accelerator.num_processes
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(LAYERS)])
    x = torch.randn(BATCH, WIDTH)
    unit = WIDTH * WIDTH + WIDTH
    shard = -(-unit // world)  # each unit padded to a multiple of the world size, as both sharders do
    full_opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    shards = [torch.zeros(shard, requires_grad=True) for _ in range(LAYERS)]
    for s in shards:
        s.grad = torch.randn(shard) * 1e-3
    shard_opt = torch.optim.AdamW(shards, lr=1e-4)
    flat = torch.randn(LAYERS * shard * world)  # the whole gradient (all-reduce, reduce-scatter in) or parameters
    units = flat.view(LAYERS, shard * world)
    summed = torch.empty(shard)
    buckets = flat.split(BUCKET_BYTES // flat.element_size())
    rank = accelerator.process_index
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    p2p_gather, p2p_reduce_scatter = tuning.p2p_all_gather(), tuning.p2p_reduce_scatter()
    a2a_reduce_scatter = tuning.all_to_all_reduce_scatter()  # as FSDP2 calls them: receive buffers per call

    def compute(opt: torch.optim.Optimizer) -> Callable[[], None]:
        def step() -> None:
            model(x).pow(2).mean().backward()
            opt.step()
            model.zero_grad()  # (the sharded step's full gradients are freed once reduce-scattered)
        return step

    def allreduce() -> None:
        for bucket in buckets:
            dist.all_reduce(bucket)

    def allgather() -> None:
        for i in range(LAYERS):
            gather(units[i], shards[i].detach())

    def allgather_p2p() -> None:
        for i in range(LAYERS):
            chunks = units[i].view(world, -1)
            p2p_gather(chunks.view(-1), chunks[rank], group=dist.group.WORLD)

    def reduce_scatter_all_to_all() -> None:
        for i in range(LAYERS):
            a2a_reduce_scatter(summed, units[i], group=dist.group.WORLD, op=dist.ReduceOp.SUM)

    def reduce_scatter_p2p() -> None:
        for i in range(LAYERS):
            p2p_reduce_scatter(summed, units[i], group=dist.group.WORLD, op=dist.ReduceOp.SUM)

    sections = {"compute_full_s": compute(full_opt), "compute_sharded_s": compute(shard_opt),
                "allreduce_s": allreduce, "allgather_s": allgather, "allgather_p2p_s": allgather_p2p,
                "reduce_scatter_all_to_all_s": reduce_scatter_all_to_all, "reduce_scatter_p2p_s": reduce_scatter_p2p}
    times: dict[str, list[float]] = {name: [] for name in sections}
    for repeat in range(1 + args.repeats):
        for name, fn in sections.items():
            elapsed = timed(fn)
            if repeat:  # the first pass warms up (AdamW's state, gloo's buffers)
                times[name].append(elapsed)
    if accelerator.is_main_process:
        params = sum(p.numel() for p in model.parameters())
        print("BENCH " + json.dumps({**{k: statistics.median(v) for k, v in times.items()},
                                     "params_mb": params * 4 / 1e6, "units": LAYERS, "world": world,
                                     "repeats": args.repeats}))
    accelerator.end_training()


if __name__ == "__main__":
    main()
