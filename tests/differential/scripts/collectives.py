"""Accelerate's collectives and process helpers, called the way scripts call them; every rank records results.

    python collectives.py --out DIR
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast, broadcast_object_list, gather, gather_object, pad_across_processes, reduce
from torch import nn


def plain(x):
    """JSON-able: tensors as {'shape', 'values', 'requires_grad'}; containers kept."""
    if isinstance(x, torch.Tensor):
        return {"shape": list(x.shape), "values": x.detach().flatten().tolist(), "dtype": str(x.dtype),
                "requires_grad": x.requires_grad}
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    torch.manual_seed(0)
    model = accelerator.prepare(nn.Linear(3, 2))
    loss = model(torch.ones(2, 3) * (rank + 1)).sum()
    record = {
        # tensors that require grad: a parameter and a loss
        "gather_parameter": plain(accelerator.gather(accelerator.unwrap_model(model).weight)),
        "gather_loss": plain(accelerator.gather(loss)),
        "gather_scalar": plain(accelerator.gather(torch.tensor(float(rank)))),
        "gather_nested": plain(accelerator.gather({"a": torch.tensor([rank]), "b": (torch.ones(1, 2) * rank,)})),
        "free_gather": plain(gather(torch.arange(2) + 10 * rank)),
        "gather_object_list": gather_object([rank, f"r{rank}"]),
        "gather_object_dict": gather_object({"rank": rank}),
        "reduce_sum": plain(accelerator.reduce(torch.tensor([1.0, rank]), "sum")),
        "reduce_mean": plain(accelerator.reduce(torch.tensor([1.0, rank]), "mean")),
        "reduce_max": plain(accelerator.reduce(torch.tensor([1.0, rank]), "max")),
        "reduce_scale": plain(accelerator.reduce(torch.tensor([2.0]), "sum", scale=3.0)),
        "reduce_none": plain(accelerator.reduce(torch.tensor([2.0]), "none")),
        "free_reduce_default": plain(reduce(torch.tensor([2.0 + rank]))),
        "pad": plain(accelerator.pad_across_processes(torch.ones(rank + 1, 2), dim=0, pad_index=-1)),
        "pad_first": plain(accelerator.pad_across_processes(torch.ones(2, rank + 1), dim=1, pad_first=True)),
        "pad_negative_dim": plain(pad_across_processes(torch.ones(1, rank + 2), dim=-1)),
    }
    t = torch.tensor([float(rank)] * 2)
    returned = broadcast(t, from_process=world - 1)
    record["broadcast"] = plain(t) | {"same_object": returned is t}
    objects = [rank, {"r": rank}]
    broadcast_object_list(objects, from_process=0)
    record["broadcast_object_list"] = objects
    with accelerator.split_between_processes(list(range(5))) as part:
        record["split_list"] = part
    with accelerator.split_between_processes(list(range(5)), apply_padding=True) as part:
        record["split_list_padded"] = part
    with accelerator.split_between_processes(torch.arange(5)) as part:
        record["split_tensor"] = plain(part)
    with accelerator.split_between_processes({"a": [1, 2, 3], "b": torch.arange(3)}) as part:
        record["split_dict"] = plain(part)
    accelerator.wait_for_everyone()
    with accelerator.main_process_first():
        record["main_process_first"] = True
    printed = accelerator.on_main_process(lambda: "main")()
    record["on_main_process"] = printed
    record["is_last_process"] = accelerator.is_last_process
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fp:
        json.dump(record, fp)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
