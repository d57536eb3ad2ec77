"""A stack of transformer MLP blocks (LayerNorm, Linear(D, 4D), GELU, Linear(4D, D), residual; D = 512, 4 blocks,
about 34 MB of fp32 parameters) trained with AdamW on a fixed global batch of 16 sequences of 32, split over the
data-parallel processes; `--sizes tp=2 dp_shard=2` gives the ParallelismConfig (the up/down Linears follow a
colwise/rowwise TP plan). Prints the per-step time and the largest per-rank peak RSS as one BENCH line on rank 0."""

import argparse
import json
import time

import torch
from torch import nn

from acc import Accelerator, ParallelismConfig

WARMUP, STEPS, DIM, BLOCKS, GLOBAL, SEQ = 1, 4, 512, 4, 16, 32
PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(DIM), nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def rss_mb(field: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", nargs="*", default=[])
    args = p.parse_args()
    sizes = {f"{k}_size": int(v) for k, v in (item.split("=") for item in args.sizes)}
    accelerator = Accelerator(parallelism_config=ParallelismConfig(**sizes) if sizes else None)
    dp = accelerator.num_processes // sizes.get("tp_size", 1)
    torch.manual_seed(0)
    model = Net()
    model.tp_plan = PLAN
    params_mb = sum(q.numel() for q in model.parameters()) * 4 / 1e6
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.utils.data.TensorDataset(torch.randn(GLOBAL * (WARMUP + STEPS), SEQ, DIM))
    loader = torch.utils.data.DataLoader(data, batch_size=GLOBAL // dp)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for i, (x,) in enumerate(loader):
        if i == WARMUP:
            accelerator.wait_for_everyone()
            start = time.perf_counter()
        accelerator.backward(model(x).pow(2).mean())
        opt.step()
        opt.zero_grad()
    accelerator.wait_for_everyone()
    per_step = (time.perf_counter() - start) / STEPS
    peaks = accelerator.gather_object([rss_mb("VmHWM")])
    if accelerator.is_main_process:
        print("BENCH " + json.dumps({"per_step_s": per_step, "peak_rss_mb": max(peaks), "params_mb": params_mb,
                                     "rows_per_dp_rank": GLOBAL // dp, "activation_mb_per_row": SEQ * DIM * 4 / 1e6}))
    accelerator.end_training()


if __name__ == "__main__":
    main()
