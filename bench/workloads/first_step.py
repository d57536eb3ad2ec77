"""Launch to first step: an Accelerator, a tiny model prepared, one optimizer step; rank 0 then prints the wall-clock
time (`BENCH {"first_step": t}`) for the benchmark to subtract its start time from.

    acc launch --backend ddp --nproc 2 first_step.py      # the CLI runs this file in each worker
    python first_step.py --python                         # this file launches train() itself: acc.launch
"""

import json
import sys
import time


def train() -> None:
    import torch

    from acc import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(32, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    loss = model(torch.ones(8, 32)).sum()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    if accelerator.is_main_process:
        print("BENCH " + json.dumps({"first_step": time.time()}), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    if "--python" in sys.argv:
        import acc

        acc.launch(train, backend="ddp", nproc=2, output_dir="")
    else:
        train()
