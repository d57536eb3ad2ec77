"""Two models with two optimizers and two schedulers (a GAN-style loop), written for Accelerate.

    python two_models.py --out DIR [--accum 2] [--mixed-precision bf16]
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--mixed-precision", default="no")
    args = p.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum, mixed_precision=args.mixed_precision)
    set_seed(7)
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.arange(48), torch.randn(48, 6, generator=g))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    generator = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6))
    critic = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Dropout(0.2), nn.Linear(12, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-2)
    opt_c = torch.optim.SGD(critic.parameters(), lr=5e-2, momentum=0.9)
    sched_g = torch.optim.lr_scheduler.StepLR(opt_g, step_size=3, gamma=0.5)
    sched_c = torch.optim.lr_scheduler.ExponentialLR(opt_c, gamma=0.9)
    generator, critic, opt_g, opt_c, loader, sched_g, sched_c = accelerator.prepare(
        generator, critic, opt_g, opt_c, loader, sched_g, sched_c)
    steps = []
    for epoch in range(2):
        for ids, x in loader:
            with accelerator.accumulate(critic):
                fake = generator(torch.randn_like(x)).detach()
                loss_c = critic(fake).mean() - critic(x).mean()
                accelerator.backward(loss_c)
                opt_c.step()
                sched_c.step()
                opt_c.zero_grad()
            with accelerator.accumulate(generator):
                loss_g = -critic(generator(torch.randn_like(x))).mean()
                accelerator.backward(loss_g)
                opt_g.step()
                sched_g.step()
                opt_g.zero_grad()
                opt_c.zero_grad()
            steps.append({"ids": ids.tolist(), "lr": opt_g.param_groups[0]["lr"], "lr_c": opt_c.param_groups[0]["lr"],
                          "loss": loss_g.item(), "loss_c": loss_c.item()})
    weights = {}
    for name, model in (("generator", generator), ("critic", critic)):
        for k, v in accelerator.unwrap_model(model).state_dict().items():
            weights[f"{name}.{k}"] = v.flatten().tolist()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{accelerator.process_index}.json"), "w") as fp:
        json.dump({"steps": steps, "weights": weights, "step": accelerator.step}, fp)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
