"""The sharded bench workload, one definition for every script that runs it: 8 x (Linear(2500, 2500) + ReLU), about
200 MB of fp32 parameters, AdamW(lr=1e-4) created before `prepare`, and a DataLoader of batch 8 prepared with them
(deepspeed takes its batch size from it); the step is `model(x).pow(2).mean()`, backward, step, zero_grad."""

import contextlib
import time

import torch
from torch import nn

WIDTH, LAYERS, BATCH = 2500, 8, 8


def prepared(accelerator, steps: int, init_module: bool = True) -> tuple:
    """(model, optimizer, loader) prepared by `accelerator`, the loader holding `steps` batches per process; the
    model built inside `accelerator.init_module()` when `init_module`."""
    torch.manual_seed(0)
    with accelerator.init_module() if init_module else contextlib.nullcontext():
        model = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(LAYERS)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.utils.data.TensorDataset(torch.randn(BATCH * steps * accelerator.num_processes, WIDTH))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    return accelerator.prepare(model, opt, loader)


def step(accelerator, model, opt, x: torch.Tensor) -> tuple[float, float, float]:
    """One training step of the workload; the seconds its forward, backward and optimizer step (zero_grad
    included) took on this rank."""
    began = time.perf_counter()
    loss = model(x).pow(2).mean()
    forward = time.perf_counter()
    accelerator.backward(loss)
    backward = time.perf_counter()
    opt.step()
    opt.zero_grad()
    return forward - began, backward - forward, time.perf_counter() - backward
