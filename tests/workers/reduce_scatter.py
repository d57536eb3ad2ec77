"""acc's point-to-point reduce-scatter against the rank-order sum and torch.distributed's, and fsdp's custom
reduce-scatter's input released once it is done; each rank writes what it saw.

    acc launch --backend ddp --nproc N reduce_scatter.py --out DIR
"""

import argparse

import torch
import torch.distributed as dist
from common import dump

from acc import Accelerator
from acc import backend as sdk


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    a = Accelerator()
    r, n = a.process_index, a.num_processes
    g = torch.Generator().manual_seed(r)
    data = torch.randn(n * 1000, generator=g)
    want = torch.empty(1000)
    dist.reduce_scatter_tensor(want, data.clone(), op=dist.ReduceOp.SUM)
    apart = torch.empty(1000)
    sdk.p2p_reduce_scatter_sum(apart, data)
    in_place = data.clone()
    sdk.p2p_reduce_scatter_sum(in_place.view(n, -1)[r], in_place)  # the output is this rank's chunk of the input
    from acc_fsdp.tuning import p2p_reduce_scatter

    comm = p2p_reduce_scatter()
    fsdp_input = comm.allocate((n * 1000,), dtype=torch.float32, device=torch.device("cpu"))
    fsdp_input.copy_(data)
    fsdp_output = comm.allocate((1000,), dtype=torch.float32, device=torch.device("cpu"))
    comm(fsdp_output, fsdp_input, dist.group.WORLD, dist.ReduceOp.AVG)
    flat = torch.cat([data, data])  # a caller's flat buffer: a view into it is summed, the buffer left whole
    view_output = torch.empty(1000)
    comm(view_output, flat[n * 1000:], dist.group.WORLD, dist.ReduceOp.AVG)
    rank_order = data.new_zeros(1000)  # every rank's chunk r, added in rank order
    for peer in range(n):
        rank_order += torch.randn(n * 1000, generator=torch.Generator().manual_seed(peer)).view(n, -1)[r]
    dump(args.out, r, {
        "apart_equal": torch.equal(apart, rank_order),
        "in_place_equal": torch.equal(in_place.view(n, -1)[r], rank_order),
        "gloo_close": torch.allclose(apart, want, rtol=0, atol=1e-5),
        "fsdp_avg_equal": torch.equal(fsdp_output, rank_order / n),
        "fsdp_input_bytes": fsdp_input.untyped_storage().nbytes(),
        "view_avg_equal": torch.equal(view_output, rank_order / n),
        "flat_kept": flat.untyped_storage().nbytes() == 2 * data.nbytes and torch.equal(flat[n * 1000:], data),
    })
    a.end_training()


if __name__ == "__main__":
    main()
