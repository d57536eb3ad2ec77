"""A training run meant to be killed: it checkpoints every few steps and, restarted, resumes from its newest one.

    acc launch --backend ddp --nproc 2 --max-restarts R --resume-data-position chaos.py --project DIR --out OUT
        --steps N --save-every K --total-limit L [--big-mb M] [--pause S]

Every rank appends one JSON line per event to OUT/events.jsonl (what a controller watches to time its kills:
"start" with the step it resumed at, "step" with the sample ids it trained, "save"/"saved" around save_state,
"load"/"loaded" around load_state), and at the end writes OUT/final<rank>.json: the sha256 and size of every
weight and optimizer-state tensor, the LR, the step count and the next random draw, for a bitwise comparison.
`--pause S` makes the registered object sleep S seconds while it is saved (main process) and loaded (every
process), so a controller has a window to kill a worker inside save_state and inside load_state.
"""

import argparse
import hashlib
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, set_seed
from acc.checkpointing.files import ProjectConfiguration, automatic_checkpoints


class Log:
    def __init__(self, path: str, rank: int, attempt: int):
        self.path, self.rank, self.attempt = path, rank, attempt

    def __call__(self, event: str, **data) -> None:
        line = json.dumps({"event": event, "rank": self.rank, "attempt": self.attempt, "pid": os.getpid(),
                           "time": time.time(), **data}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write of a short line with O_APPEND: lines never interleave
        finally:
            os.close(fd)


class Progress:
    """Registered for checkpointing: the steps done (restored with the checkpoint), and a blob that makes saving
    take a while; sleeps `pause` seconds inside save_state/load_state when asked."""

    def __init__(self, log: Log, big_mb: int, pause: float):
        self.count, self.log, self.pause = 0, log, pause
        self.blob = torch.arange(big_mb * 2**18, dtype=torch.float32) if big_mb else None

    def state_dict(self):
        self.log("in-save", step=self.count)
        time.sleep(self.pause)
        return {"count": self.count, **({"blob": self.blob} if self.blob is not None else {})}

    def load_state_dict(self, state):
        self.log("in-load", step=state["count"])
        time.sleep(self.pause)
        self.count = state["count"]


def no_space_from(save: int) -> None:
    """Make torch.save (the writer below acc's checkpoint files) fail as a full disk does, from save `save` on."""
    import errno

    real, saves = torch.save, {"n": 0}
    original_save_state = Accelerator.save_state

    def save_state(self, *a, **k):
        saves["n"] += 1
        return original_save_state(self, *a, **k)

    def failing(obj, f, *a, **k):
        if saves["n"] >= save:
            with open(f, "wb") as fp:
                fp.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real(obj, f, *a, **k)

    Accelerator.save_state = save_state
    torch.save = failing


def digests(tensors) -> list:
    out = []
    for name, t in tensors:
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        out.append([name, hashlib.sha256(data).hexdigest(), len(data)])
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--project", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--total-limit", type=int, default=2)
    p.add_argument("--big-mb", type=int, default=0)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--load", help="load this checkpoint (default: the newest automatic one, if any)")
    p.add_argument("--no-space-at-save", type=int, default=0,
                   help="where a small file system cannot be mounted: torch.save fails with ENOSPC from save N on")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    config = ProjectConfiguration(project_dir=args.project, automatic_checkpoint_naming=True,
                                  total_limit=args.total_limit)
    accelerator = Accelerator(project_config=config)
    rank = accelerator.process_index
    log = Log(os.path.join(args.out, "events.jsonl"), rank, attempt)
    set_seed(0)
    g = torch.Generator().manual_seed(5)
    n = args.samples
    data = TensorDataset(torch.randn(n, 6, generator=g), torch.randn(n, 1, generator=g), torch.arange(n))
    model = nn.Sequential(nn.Linear(6, 32), nn.Dropout(0.2), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.8)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers)
    model, opt, sched, loader = accelerator.prepare(model, opt, sched, loader)
    progress = Progress(log, args.big_mb, args.pause)
    accelerator.register_for_checkpointing(progress)
    if args.no_space_at_save:
        no_space_from(args.no_space_at_save)
    if args.load or automatic_checkpoints(config.checkpoints_dir):
        log("load")
        loaded = accelerator.load_state(args.load)
        log("loaded", checkpoint=loaded.name, step=progress.count)
    log("start", step=progress.count)
    while progress.count < args.steps:
        for x, y, idx in loader:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            progress.count += 1
            log("step", step=progress.count - 1, idx=idx.tolist())
            if progress.count % args.save_every == 0:
                log("save", step=progress.count)
                saved = accelerator.save_state()
                log("saved", step=progress.count, checkpoint=saved.name)
            if progress.count == args.steps:
                break
    inner = accelerator.unwrap_model(model)
    if hasattr(inner, "parameters") and any(type(p).__name__ == "DTensor" for p in inner.parameters()):
        weights = [(k, v.full_tensor()) for k, v in inner.state_dict().items()]
        state = opt.state_dict()["state"]
        adam = [(f"{i}.{k}", v.full_tensor() if hasattr(v, "full_tensor") else v)
                for i, s in sorted(state.items()) for k, v in sorted(s.items())]
    else:
        weights = list(inner.state_dict().items())
        state = opt.state_dict()["state"]
        adam = [(f"{i}.{k}", v) for i, s in sorted(state.items()) for k, v in sorted(s.items())]
    result = {"weights": digests(weights), "adam": digests(adam), "lr": sched.get_last_lr(), "steps": progress.count,
              "applied": accelerator.applied_steps, "rand": torch.rand(2).tolist(), "attempt": attempt}
    path = os.path.join(args.out, f"final{rank}.json")
    with open(path + ".tmp", "w") as fp:
        json.dump(result, fp)
    os.replace(path + ".tmp", path)
    log("end", step=progress.count)
    accelerator.end_training()


if __name__ == "__main__":
    main()
