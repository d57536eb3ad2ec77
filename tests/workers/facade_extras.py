"""Accelerate's less common Accelerator members on several processes; each rank writes what it saw.

    acc launch --backend ddp --nproc 2 facade_extras.py --out DIR
"""

import argparse
import os
import pickle

import torch
from common import dump
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, DataLoaderConfiguration, set_seed
from acc.utils import ProfileKwargs


def grads(model):
    return [float(p.grad.sum()) for p in model.parameters()]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
    rank, record = accelerator.process_index, {}
    set_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    x = torch.ones(2, 4) * (rank + 1)

    # check_trigger: one process raises the flag, every process sees it once
    seen = []
    for step in range(4):
        if rank == 1 and step == 2:
            accelerator.set_trigger()
        seen.append(accelerator.check_trigger())
    record["triggers"] = seen

    # trigger_sync_in_backward: inside no_sync the gradients still synchronise
    with accelerator.no_sync(model):
        accelerator.backward(model(x).sum())
    record["no_sync_grads"] = accelerator._gather_objects(grads(model))
    opt.zero_grad()
    with accelerator.no_sync(model):
        with accelerator.trigger_sync_in_backward(model):
            accelerator.backward(model(x).sum())
    record["forced_sync_grads"] = accelerator._gather_objects(grads(model))
    opt.zero_grad()

    # join_uneven_inputs: of its 4 batches, rank 0 trains on 2 and rank 1 on 4; nobody hangs
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=2))
    lengths = {0: 2, 1: 4}
    steps = 0
    with accelerator.join_uneven_inputs([model]):
        for i, (xb,) in enumerate(loader):
            if i >= lengths[rank]:
                break
            accelerator.backward(model(xb).sum())
            opt.step()
            opt.zero_grad()
            steps += 1
    record["joined_steps"] = steps

    # profile: a trace per process
    trace_dir = os.path.join(args.out, "traces")
    with accelerator.profile(ProfileKwargs(activities=["cpu"], output_trace_dir=trace_dir)) as prof:
        model(x).sum()
    record["trace"] = os.path.exists(os.path.join(trace_dir, f"trace_rank_{rank}.json"))
    record["profiled_events"] = len(prof.key_averages()) > 0

    # pickling refers to this process's accelerator
    record["pickled_is_same"] = pickle.loads(pickle.dumps(accelerator)) is accelerator
    record["verify_device_map"] = accelerator.verify_device_map(accelerator.unwrap_model(model))

    # free_memory drops every reference
    released = accelerator.free_memory(model, opt)
    record["released"] = released == [None, None]
    record["after_free"] = [len(accelerator._models), len(accelerator._optimizers), len(accelerator._dataloaders),
                            accelerator.step]
    dump(args.out, rank, record)
    accelerator.end_training()


if __name__ == "__main__":
    main()
