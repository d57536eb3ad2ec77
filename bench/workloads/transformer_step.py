"""One small transformer block trained on random tokens; prints seconds per step (precision and torch.compile
from acc launch)."""

import json
import time

import torch
from torch import nn

from acc import Accelerator, set_seed

WARMUP, STEPS = 5, 30


def main() -> None:
    accelerator = Accelerator()
    set_seed(0)
    block = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
    head = nn.Linear(256, 256)
    model = nn.Sequential(block, head)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = accelerator.prepare(model, opt)
    x = torch.randn(16, 64, 256, device=accelerator.device)
    begin = time.perf_counter()
    for i in range(WARMUP + STEPS):
        if i == WARMUP:
            start = time.perf_counter()
            warmup = start - begin
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    per_step = (time.perf_counter() - start) / STEPS
    print("BENCH " + json.dumps({"per_step_s": per_step, "warmup_s": warmup,
                                  "mixed_precision": accelerator.mixed_precision,
                                  "compiled": hasattr(model, "_orig_mod")}))


if __name__ == "__main__":
    main()
