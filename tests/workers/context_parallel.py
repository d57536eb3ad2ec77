"""Context parallel on CUDA (scripts/gpu-check.sh, 2+ GPUs): a tiny causal-attention model trained 2 SGD steps, each
step inside `accelerator.maybe_context_parallel` with the token ids and labels sharded along the sequence; the main
process saves the final full weights and every step's loss (averaged over the cp ranks).

    python context_parallel.py --out DIR                       # the one-process reference
    acc launch --backend fsdp --nproc 2 --parallelism-config-cp-size 2 context_parallel.py --out DIR
"""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch import nn

from acc import Accelerator

VOCAB, WIDTH, HEADS, SEQ, BATCH, STEPS = 64, 64, 4, 128, 2, 2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        q, k, v = (t.unflatten(-1, (HEADS, -1)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        return self.head(x + self.out(attended))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = Attention()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.randint(0, VOCAB, (STEPS * BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=BATCH)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    losses = []
    for (batch,) in loader:
        labels = batch.clone()
        with accelerator.maybe_context_parallel(buffers=[batch, labels], buffer_seq_dims=[1, 1],
                                                no_restore_buffers={batch, labels}):
            logits = model(batch)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        os.makedirs(args.out, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in state.items()}, os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "result.json"), "w") as fp:
            json.dump({"losses": losses, "world": accelerator.num_processes,
                       "cp": accelerator.parallelism_config.cp_size if accelerator.parallelism_config else 1}, fp)
    accelerator.end_training()


if __name__ == "__main__":
    main()
