"""DistributedDataParallelKwargs(comm_hook=...) on the ddp backend: each rank writes, per step, the gradient DDP
left on its replica and the exact mean of the ranks' local gradients (all-reduced by hand).

    acc launch --backend ddp --nproc 2 ddp_comm_hook.py --out DIR --mode no|fp16|power_sgd|power_sgd_fp16
"""

import argparse

import torch
from common import dump
from torch import nn

from acc import Accelerator
from acc.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

MODES = {
    "no": {},
    "fp16": {"comm_hook": DDPCommunicationHookType.FP16},
    "power_sgd": {"comm_hook": DDPCommunicationHookType.POWER_SGD,
                  "comm_state_option": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}},
    "power_sgd_fp16": {"comm_hook": "power_sgd", "comm_wrapper": "fp16",
                       "comm_state_option": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}},
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=sorted(MODES), required=True)
    args = p.parse_args()
    accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(**MODES[args.mode])])
    rank = accelerator.process_index
    payload = {"world": accelerator.num_processes}
    if args.mode == "fp16":
        # the gradient of w is the input: 1 + 2**-12 on rank 0 (not a float16 number), 1 on rank 1
        model = nn.Linear(1, 1, bias=False)
        nn.init.ones_(model.weight)
        model = accelerator.prepare(model)
        x = torch.tensor([[1.0 + 2.0**-12 if rank == 0 else 1.0]])
        accelerator.backward(model(x).sum())
        payload["grad"] = model.module.weight.grad.item()
    else:
        torch.manual_seed(0)
        model = accelerator.prepare(nn.Linear(8, 8, bias=False))
        g = torch.Generator().manual_seed(100 + rank)
        payload["grads"], payload["exact"] = [], []
        for _ in range(4):
            x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
            model.zero_grad()
            accelerator.backward((model(x) * y).sum())  # d/dW = y^T x, different on each rank
            local = y.t() @ x
            payload["grads"].append(model.module.weight.grad.flatten().tolist())
            payload["exact"].append(accelerator.reduce(local, reduction="mean").flatten().tolist())
    dump(args.out, rank, payload)
    accelerator.end_training()


if __name__ == "__main__":
    main()
