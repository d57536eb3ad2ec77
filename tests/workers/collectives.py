"""Exercise every collective of the facade; each rank writes what it got.

    acc launch --backend ddp --nproc N collectives.py --out DIR
"""

import argparse
import time

import torch
from common import dump

from acc import Accelerator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    a = Accelerator()
    r, n = a.process_index, a.num_processes
    rows = torch.full((r + 1, 2), float(r))  # rank r contributes r+1 rows: dims differ across ranks
    result = {
        "world": n,
        "gather_uneven": a.gather(rows).tolist(),
        "gather_nested": {k: v.tolist() for k, v in a.gather({"a": torch.tensor([r]), "b": torch.tensor([[r, r]])}).items()},
        "gather_scalar": a.gather(torch.tensor(float(r))).tolist(),
        "gather_bool": a.gather(torch.tensor([r % 2 == 0])).tolist(),
        "reduce": {op: a.reduce(torch.tensor([float(r + 1), 10.0 * r]), op).tolist()
                   for op in ("sum", "mean", "max", "min")},
        "reduce_int_mean": a.reduce(torch.tensor([r + 1]), "mean").tolist(),
        "broadcast": a.broadcast(torch.tensor([float(r)] * 3), from_process=n - 1).tolist(),
        "broadcast_object": a.broadcast_object({"from": r}, from_process=0),
        "gather_object": a.gather_object({"rank": r}),
        "padded": a.pad_across_processes(torch.ones(r + 1, dtype=torch.long), dim=0, pad_index=-1).tolist(),
        "padded_first": a.pad_across_processes(torch.ones(r + 1), dim=0, pad_first=True).tolist(),
    }
    # acc.utils.synchronize_rng_states: rank 0's global and generator states on every rank (each seeded its own)
    from acc.utils import synchronize_rng_states

    torch.manual_seed(100 + r)
    generator = torch.Generator().manual_seed(200 + r)
    synchronize_rng_states(["torch", "generator"], generator=generator)
    result["synced_draws"] = [torch.rand(3).tolist(), torch.rand(3, generator=generator).tolist()]
    with a.split_between_processes(list(range(7))) as part:
        result["split"] = part
    with a.split_between_processes(list(range(7)), apply_padding=True) as part:
        result["split_padded"] = part
    order = []
    with a.main_process_first():
        order.append(time.monotonic())
    result["first_time"] = order[0]
    a.wait_for_everyone()
    dump(args.out, r, result)
    a.end_training()


if __name__ == "__main__":
    main()
