"""A small character-level transformer language model, trained on Python's own standard-library source
(text that ships with Python itself: no download). Mixed precision, gradient accumulation and resume, on any
backend:

    acc launch --mixed-precision bf16 examples/char_lm.py
    acc launch --backend ddp --nproc 2 --mixed-precision bf16 examples/char_lm.py --steps 600 --grad-accum 2
    acc launch --backend ddp --nproc 2 --mixed-precision bf16 examples/char_lm.py --steps 800 --resume
Prints the validation loss (nats per character) every evaluation, and a sample of generated text at the end.
"""

import argparse
import math
import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

from acc import Accelerator, set_seed
from acc.checkpointing.files import ProjectConfiguration


def corpus(max_chars: int) -> str:
    """Python source files of the standard library, in a fixed order, up to `max_chars` characters."""
    root = Path(os.__file__).parent
    parts, size = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        parts.append(text)
        size += len(text)
        if size >= max_chars:
            break
    return "".join(parts)[:max_chars]


def windows(ids: torch.Tensor, context: int) -> TensorDataset:
    count = (len(ids) - 1) // context
    x = ids[: count * context].view(count, context)
    y = ids[1 : count * context + 1].view(count, context)
    return TensorDataset(x, y)


class CharTransformer(nn.Module):
    def __init__(self, vocab: int, context: int, width: int = 128, heads: int = 4, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.embed(x) + self.position[:n]
        return self.head(self.blocks(h, mask=self.mask[:n, :n], is_causal=True))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400, help="optimizer steps in total")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--chars", type=int, default=1_000_000)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--project-dir", default="runs/char_lm")
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()

    config = ProjectConfiguration(project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2)
    # acc's own semantics: the schedule counts optimizer steps on any number of processes, and --resume
    # continues the data exactly where the checkpoint stopped
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum, project_config=config, semantics="acc")
    set_seed(0)
    text = corpus(args.chars)
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(0.95 * len(ids))
    train = DataLoader(windows(ids[:split], args.context), batch_size=args.batch_size, shuffle=True, drop_last=True)
    val = DataLoader(windows(ids[split:], args.context), batch_size=args.batch_size)
    model = CharTransformer(len(vocab), args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    model, optimizer, train, val, scheduler = accelerator.prepare(model, optimizer, train, val, scheduler)
    if args.resume:
        accelerator.load_state()
        accelerator.print(f"resumed at optimizer step {accelerator.applied_steps}")

    def evaluate() -> float:
        model.eval()
        total, count = torch.zeros((), device=accelerator.device), 0
        with torch.no_grad():
            for x, y in val:
                losses = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none")
                gathered = accelerator.gather_for_metrics(losses.view(x.shape[0], -1).mean(dim=1))
                total += gathered.sum()
                count += gathered.numel()
        model.train()
        return float(total) / max(count, 1)

    bar = tqdm(total=args.steps, initial=accelerator.applied_steps, disable=not accelerator.is_local_main_process)
    loss_value = float("nan")
    while accelerator.applied_steps < args.steps:
        for x, y in train:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                loss_value = loss.item()
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.3f}")
                if accelerator.applied_steps % args.eval_every == 0:
                    message = f"step {accelerator.applied_steps}: validation loss {evaluate():.4f}"  # all evaluate
                    if accelerator.is_local_main_process:
                        bar.write(message)  # on its own line, above the progress bar
                    accelerator.save_state()
            if accelerator.applied_steps >= args.steps:
                break
    bar.close()
    final = evaluate()
    accelerator.print(f"final validation loss {final:.4f} nats/char ({final / math.log(2):.3f} bits/char)")
    # every process runs the model (a sharded one needs them all); the main process prints
    model.eval()
    context = ids[split : split + 32].unsqueeze(0).to(accelerator.device)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(80):
            logits = model(context[:, -args.context:])[:, -1].float().cpu()
            choice = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).to(accelerator.device)
            context = torch.cat([context, choice], dim=1)
    accelerator.print("sample:", repr("".join(vocab[i] for i in context[0].tolist())))
    accelerator.end_training()


if __name__ == "__main__":
    main()
