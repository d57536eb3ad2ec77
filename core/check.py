"""The job `acc check` runs on a backend: a small, fully known training run that checks itself.

Run as `python -m acc.check --out FILE` under any launch; it uses only the public facade, so every
backend (including third-party ones) is checked through its hooks. Process 0 writes the results as
JSON: {"planned": [check names], "results": [{check, ok, measured, expected}, ...]}, rewritten after each
check.
"""

from __future__ import annotations

import argparse
import copy
import json
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from . import lifecycle
from .accelerator import Accelerator
from .seed import set_seed

STEPS, BATCH, SAMPLES, EVAL_SAMPLES, EVAL_BATCH = 4, 4, 96, 83, 5


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(SAMPLES, 6, generator=g), torch.randn(SAMPLES, 1, generator=g))


def _fingerprint(model: nn.Module) -> list[float]:
    """A number per gradient; a sharded gradient (DTensor) counts whole, so sharding backends compare too."""
    out = []
    for p in model.parameters():
        grad = p.grad
        if grad is not None and hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()
        out.append(float(grad.double().sum()) if grad is not None else 0.0)
    return out


CHECKS = (
    "processes started, ranks unique",
    "each process on its own expected device",
    "batch size per process and global",
    f"loss after {STEPS} steps matches a single-process reference",
    "gradients identical across processes after a sync step",
    "metric gathering sees every evaluation sample exactly once",
    "save/load round-trip reproduces the next step's loss",
    "data position after load_state follows the run's semantics",
)


class _Results:
    """Check results, rewritten to the output file (by process 0) after each one, so a job that dies
    midway still tells which checks passed and which one broke."""

    def __init__(self, out: Path, writer: bool):
        self.out, self.writer, self.items = out, writer, []
        self._write()

    def add(self, name: str, ok: bool, measured: Any, expected: Any) -> None:
        self.items.append({"check": name, "ok": bool(ok), "measured": str(measured), "expected": str(expected)})
        self._write()

    def _write(self) -> None:
        if self.writer:
            self.out.write_text(json.dumps({"planned": list(CHECKS), "results": self.items}, indent=2))


def run(out: Path, expected_world: int | None, expected_device: str | None) -> None:
    acc = Accelerator()
    world, rank = acc.num_processes, acc.process_index
    results = _Results(out, acc.is_main_process)
    check = results.add
    current = {"name": CHECKS[0]}

    def failing(exc: BaseException) -> None:
        """A check raised: record it as failed and leave (the other processes then fail fast too)."""
        check(current["name"], False, f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
              "no error")
        lifecycle.record_error(type(exc), exc, exc.__traceback__)
        lifecycle.fail(1)

    try:
        _run_checks(acc, world, rank, check, current, expected_world, expected_device)
    except Exception as exc:  # noqa: BLE001 - any failure is a check result
        failing(exc)


def _run_checks(acc: Accelerator, world: int, rank: int, check: Any, current: dict, expected_world: int | None,
                expected_device: str | None) -> None:

    current["name"] = CHECKS[0]
    ranks = acc._gather_objects(rank)
    want_world = expected_world or world
    check("processes started, ranks unique", sorted(ranks) == list(range(want_world)) and world == want_world,
          f"{world} processes, ranks {sorted(ranks)}", f"{want_world} processes, ranks 0..{want_world - 1}")

    current["name"] = CHECKS[1]
    places = acc._gather_objects((socket.gethostname(), acc.local_process_index, str(acc.device)))
    accelerators = [(host, dev) for host, _, dev in places if not dev.startswith("cpu")]
    kinds = sorted({dev.split(":")[0] for _, _, dev in places})
    device_ok = len(accelerators) == len(set(accelerators)) and (expected_device is None or kinds == [expected_device])
    check("each process on its own expected device", device_ok, ", ".join(d for _, _, d in places),
          f"{expected_device or 'any'}; no two processes on one accelerator")

    current["name"] = CHECKS[2]
    set_seed(0)
    model = _model()
    reference = copy.deepcopy(model)  # same initial weights, trained in plain torch on the global batches
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    loader = DataLoader(_data(), batch_size=BATCH, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)

    sizes, losses, ref_losses, grads_agree = [], [], [], []
    it = iter(loader)
    for _ in range(STEPS):
        x, y = next(it)
        sizes.append(acc._gather_objects(int(x.shape[0])))
        loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        fingerprints = acc._gather_objects(_fingerprint(acc.unwrap_model(model)))
        grads_agree.append(all(fp == fingerprints[0] for fp in fingerprints))
        opt.step()
        opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach().float(), "mean")))
        gx, gy = acc.gather((x, y))
        ref_loss = nn.functional.mse_loss(reference(gx.float().cpu()), gy.float().cpu())
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(float(ref_loss.detach()))

    per_process = sizes[0][0] if sizes and sizes[0] else None
    batch_ok = all(s == [BATCH] * world for s in sizes)
    check("batch size per process and global", batch_ok, f"per process {per_process}, global {sum(sizes[0])}",
          f"per process {BATCH}, global {BATCH * world}")

    mixed = acc.mixed_precision != "no"
    tolerance = 5e-2 if mixed else 1e-4
    worst = max(abs(a - b) / max(abs(b), 1e-8) for a, b in zip(losses, ref_losses))
    check(f"loss after {STEPS} steps matches a single-process reference", worst <= tolerance,
          f"max relative difference {worst:.2e} (losses {', '.join(f'{v:.5f}' for v in losses)})",
          f"<= {tolerance:.0e}")

    check("gradients identical across processes after a sync step", all(grads_agree),
          f"{sum(grads_agree)} of {len(grads_agree)} steps agree", "every step")

    current["name"] = CHECKS[5]
    eval_loader = acc.prepare(DataLoader(TensorDataset(torch.arange(EVAL_SAMPLES)), batch_size=EVAL_BATCH))
    seen: list[int] = []
    for (ids,) in eval_loader:
        seen.extend(int(i) for i in acc.gather_for_metrics(ids))
    check("metric gathering sees every evaluation sample exactly once", seen == list(range(EVAL_SAMPLES)),
          f"{len(seen)} samples, {len(set(seen))} distinct" + ("" if seen == sorted(seen) else ", out of order"),
          f"{EVAL_SAMPLES} samples, each once, in order")

    current["name"] = CHECKS[6]
    directory = tempfile.mkdtemp(prefix="acc-check-") if acc.is_main_process else None
    directory = acc.broadcast_object(directory)
    acc.save_state(Path(directory) / "ckpt")

    def step_loss(x: torch.Tensor, y: torch.Tensor) -> float:
        loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        return float(acc.reduce(loss.detach().float(), "mean"))

    x, y = next(it)  # the batch after the save
    before = step_loss(x, y)
    acc.load_state(Path(directory) / "ckpt")
    after = step_loss(x, y)  # model, optimizer (and RNG) as saved: the same step gives the same loss
    check("save/load round-trip reproduces the next step's loss", before == after, f"{after!r} after load",
          f"{before!r} (bitwise)")

    current["name"] = CHECKS[7]
    exact = acc.settings["resume_data_position"]
    x_next, _ = next(iter(loader))
    epoch, taken = loader.position()
    if exact:  # acc's exact resume: the data continue with the batch that followed the save
        ok, measured = torch.equal(x_next, x) and taken == STEPS + 1, f"continued with batch {taken} of epoch {epoch}"
        expected = f"batch {STEPS + 1} (the one after the save), resume_data_position = true"
    else:  # Accelerate's: the epoch starts again (scripts skip what they trained, with skip_first_batches)
        ok, measured = taken == 1, f"started again at batch {taken} of epoch {epoch}"
        expected = "batch 1 of the epoch (resume_data_position = false: the script skips batches itself)"
    check("data position after load_state follows the run's semantics", ok, measured, expected)
    acc.wait_for_everyone()
    if acc.is_main_process:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    acc.end_training()


def main() -> None:
    parser = argparse.ArgumentParser(description="acc check job (run by `acc check`)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--expected-world", type=int, default=None)
    parser.add_argument("--expected-device", default=None)
    args = parser.parse_args()
    run(Path(args.out), args.expected_world, args.expected_device)


if __name__ == "__main__":
    main()
