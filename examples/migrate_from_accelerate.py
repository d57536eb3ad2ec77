"""A script written for Hugging Face Accelerate, moved to acc by changing one line: the import.

    # from accelerate import Accelerator               <- before
    from acc import Accelerator                        # after; nothing else changed

    acc launch --backend ddp --nproc 2 examples/migrate_from_accelerate.py
It uses the common Accelerate idioms: prepare, accumulate, backward, clip_grad_norm_ on sync steps,
gather_for_metrics, print, is_main_process, wait_for_everyone, unwrap_model, save_state, get_logger.
"""

import argparse
import logging

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

from acc import Accelerator  # was: from accelerate import Accelerator
from acc.logging import get_logger  # was: from accelerate.logging import get_logger

logger = get_logger(__name__)


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, 3, generator=torch.Generator().manual_seed(123))
    return TensorDataset(x, (x @ w).argmax(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--output-dir", default="runs/migrated")
    args = parser.parse_args()
    logging.basicConfig(format="%(message)s", level=logging.INFO)

    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = DataLoader(make_data(2048, 0), batch_size=32, shuffle=True)
    evaluation = DataLoader(make_data(500, 1), batch_size=64)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3,
                                                    total_steps=args.epochs * len(train) // 2 + 1)
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(model, optimizer, train, evaluation,
                                                                         scheduler)
    logger.info(f"training on {accelerator.num_processes} process(es)")
    accuracy = 0.0
    for epoch in range(args.epochs):
        model.train()
        for x, y in tqdm(train, disable=not accelerator.is_local_main_process, leave=False):
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        model.eval()
        correct = total = 0
        for x, y in evaluation:
            with torch.no_grad():
                predictions = model(x).argmax(dim=1)
            predictions, references = accelerator.gather_for_metrics((predictions, y))
            correct += (predictions == references).sum().item()
            total += references.numel()
        accuracy = correct / total
        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f} ({total} samples)")
    accelerator.wait_for_everyone()
    accelerator.save_state(f"{args.output_dir}/state")
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), f"{args.output_dir}/model.pt")
    accelerator.print(f"final accuracy {accuracy:.3f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
