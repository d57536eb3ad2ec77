"""Accelerate's debug mode on several processes: the shape checks before reduce, broadcast and
pad_across_processes, and copy_tensor_to_devices; each rank writes what it saw.

    acc launch --backend ddp --nproc 2 debug_checks.py --out DIR
"""

import argparse

import torch
from common import dump

from acc.state import PartialState
from acc.utils import DistributedOperationException
from acc.utils.operations import broadcast, copy_tensor_to_devices, pad_across_processes, reduce


def refused(fn, data) -> str:
    try:
        fn(data)
    except DistributedOperationException as exc:
        return str(exc)
    return ""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    state = PartialState()
    r = state.process_index
    mismatched = torch.zeros(r + 1, 2)  # rank r: r+1 rows
    more_dims = torch.zeros([1] * (2 + r))  # rank r: 2+r dimensions
    result = {"debug_default": state.debug, "padded_without_debug": list(pad_across_processes(mismatched).shape)}
    state.debug = True
    result.update({
        "debug": state.debug,
        "reduce": refused(reduce, {"t": mismatched}),
        "broadcast": refused(broadcast, mismatched),
        "pad_rows": refused(pad_across_processes, mismatched),  # same dims, other sizes: what padding is for
        "pad_dims": refused(pad_across_processes, more_dims),
        "reduce_same": reduce(torch.tensor([float(r)])).tolist(),
    })
    state.debug = False
    result["copied"] = copy_tensor_to_devices(torch.tensor([7, 8, 9]) if r == 0 else None).tolist()
    dump(args.out, r, result)


if __name__ == "__main__":
    main()
