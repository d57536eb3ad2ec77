"""gather_for_metrics over a large evaluation set (predictions and labels per batch); prints the seconds the
evaluation loop took on rank 0. `acc` or `accelerate` as argv[1]; launched with torchrun."""

import json
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, BATCH = 200_003, 1000


def main() -> None:
    which = sys.argv[1]
    if which == "acc":
        from acc import Accelerator
    else:
        from accelerate import Accelerator
    accelerator = Accelerator(cpu=True) if which == "accelerate" else Accelerator()
    data = TensorDataset(torch.arange(SAMPLES), torch.randint(0, 10, (SAMPLES,)))
    loader = accelerator.prepare(DataLoader(data, batch_size=BATCH))
    accelerator.wait_for_everyone()
    start = time.perf_counter()
    seen = 0
    for ids, labels in loader:
        predictions = (ids % 10 == labels).long()
        ids, predictions = accelerator.gather_for_metrics((ids, predictions))
        seen += ids.numel()
    elapsed = time.perf_counter() - start
    assert seen == SAMPLES, seen
    if accelerator.is_main_process:
        print("BENCH " + json.dumps({"seconds": elapsed, "samples": seen}))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
