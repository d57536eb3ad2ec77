"""Handwritten digits (the 8x8 images that ship inside scikit-learn: no download), a small CNN, evaluation
accuracy gathered across processes, a checkpoint every epoch, metrics logged by the built-in jsonl tracker
(`acc plot runs/digits` draws them). Runs unchanged on any backend:

    acc launch examples/digits.py
    acc launch --backend ddp --nproc 2 examples/digits.py --epochs 30
    acc launch --backend ddp --nproc 2 examples/digits.py --resume      # continue from the newest checkpoint
"""

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

from acc import Accelerator, set_seed
from acc.checkpointing.files import ProjectConfiguration


def datasets(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    split = int(0.8 * len(labels))
    train, test = order[:split], order[split:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    p.add_argument("--project-dir", default="runs/digits")
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()

    config = ProjectConfiguration(project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2)
    # acc's own semantics: scheduler.step() once per epoch means one step, on any number of processes
    accelerator = Accelerator(project_config=config, semantics="acc", log_with="jsonl")
    accelerator.init_trackers("digits", config=vars(args))
    set_seed(0)
    train_set, test_set = datasets()
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    train = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test = DataLoader(test_set, batch_size=64)
    net, optimizer, train, test, scheduler = accelerator.prepare(net, optimizer, train, test, scheduler)
    start = 0
    if args.resume:
        accelerator.load_state()
        start = config.iteration  # one checkpoint per finished epoch
        accelerator.print(f"resumed after epoch {start - 1}")

    accuracy = 0.0
    for epoch in range(start, args.epochs):
        net.train()
        bar = tqdm(train, desc=f"epoch {epoch}", disable=not accelerator.is_local_main_process, leave=False)
        for step, (x, y) in enumerate(bar):
            loss = nn.functional.cross_entropy(net(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            accelerator.log({"train_loss": loss.item()}, step=epoch * len(train) + step)
            if args.max_steps and step + 1 >= args.max_steps:
                break
        scheduler.step()
        net.eval()
        correct = seen = 0
        with torch.no_grad():
            for x, y in test:
                predictions, labels = accelerator.gather_for_metrics((net(x).argmax(dim=1), y))
                correct += (predictions == labels).sum().item()
                seen += labels.numel()
        accuracy = correct / seen
        accelerator.log({"test_accuracy": accuracy, "lr": scheduler.get_last_lr()[0]}, step=(epoch + 1) * len(train))
        accelerator.print(f"epoch {epoch}: test accuracy {accuracy:.4f} on {seen} images")
        accelerator.save_state()
    accelerator.print(f"final test accuracy {accuracy:.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
