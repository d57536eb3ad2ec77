"""The pieces of a sharded step on the bench model (sharded_step.py's 8 x Linear(2500, 2500), batch 8, AdamW),
timed apart on every rank at once (the processes contend for the cores as in a real step), with plain torch and
raw torch.distributed on acc's gloo group:
  compute_full     forward + backward + AdamW over all parameters, no communication (ddp's local work)
  compute_sharded  forward + backward + AdamW over flat shards of 1/W of each unit (fsdp's and ZeRO-3's local work)
  allreduce        all_reduce of the whole gradient in 25 MB buckets (DDP's default bucket size)
  allgather        all_gather_single (FSDP2's call; all_gather_into_tensor before it) of each unit from its 1/W
                   shard, one pass over the 8 units
  allgather_p2p    the same all-gather by isend/irecv with every peer (the same bytes; gloo's all-gather is slower)
  reduce_scatter   per unit, all_to_all_single + a local sum of the W chunks (acc's fsdp reduce-scatter on gloo)
Each figure is the median over `--repeats` (after one warm-up), seconds per step, with barriers around every
timed section; the sections are interleaved within each repeat so drift affects all alike. Prints one BENCH line
on rank 0. Launched with `acc launch --backend ddp --nproc 2`."""

import argparse
import json
import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from acc import Accelerator

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
    received = torch.empty(shard * world)
    summed = torch.empty(shard)
    buckets = flat.split(BUCKET_BYTES // flat.element_size())
    rank, peers = accelerator.process_index, [p for p in range(world) if p != accelerator.process_index]
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

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
            chunks, mine = units[i].view(world, -1), shards[i].detach()
            chunks[rank].copy_(mine)
            ops = [op for p in peers for op in (dist.P2POp(dist.isend, mine, p), dist.P2POp(dist.irecv, chunks[p], p))]
            for request in dist.batch_isend_irecv(ops):
                request.wait()

    def reduce_scatter() -> None:
        for i in range(LAYERS):
            dist.all_to_all_single(received, units[i])
            torch.sum(received.view(world, -1), dim=0, out=summed)

    sections = {"compute_full_s": compute(full_opt), "compute_sharded_s": compute(shard_opt),
                "allreduce_s": allreduce, "allgather_s": allgather, "allgather_p2p_s": allgather_p2p,
                "reduce_scatter_s": reduce_scatter}
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
