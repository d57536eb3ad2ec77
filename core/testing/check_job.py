"""The job `acc check` runs on a backend: a small, fully known training run that checks itself.

Run as `python -m acc.check --out FILE` under any launch; it uses only the public facade, so every
backend (including third-party ones) is checked through its hooks. Process 0 writes the results as
JSON: {"planned": [check names], "results": [{check, ok, measured, expected}, ...]}, rewritten after each
check. With mixed precision, process 0 then measures a training step of the run's mode against float32 on the
same model and data (`compare_precision`: step-time ratio, median of alternating repeats, and the loss
difference) and adds it as "precision".
"""

from __future__ import annotations

import argparse
import copy
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc.accelerator import Accelerator
from acc.runtime import lifecycle
from acc.runtime.seeding import set_seed

STEPS, BATCH, SAMPLES, EVAL_SAMPLES, EVAL_BATCH = 4, 4, 96, 83, 5


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def _data(samples: int = SAMPLES) -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(samples, 6, generator=g), torch.randn(samples, 1, generator=g))


def _fingerprint(model: nn.Module) -> list[float]:
    """A number per gradient; a sharded gradient (DTensor) counts whole, so sharding backends compare too."""
    out = []
    for p in model.parameters():
        grad = p.grad
        if grad is not None and hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()
        out.append(float(grad.double().sum()) if grad is not None else 0.0)
    return out


def _params_fingerprint(model: nn.Module) -> list[float]:
    """A number per parameter (whole, also when sharded)."""
    out = []
    for p in model.parameters():
        value = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(float(value.detach().double().sum()))
    return out


def training_checks(caps: Any) -> tuple[str, str]:
    """The two training checks for the backend's synchronisation model (its declared capabilities)."""
    if caps.sync == "periodic":
        return (f"replicas agree at every synchronisation (every {caps.sync_period} steps)",
                "each process keeps its own gradients between synchronisations")
    return (f"loss after {STEPS} steps matches a single-process reference",
            "gradients identical across processes after a sync step")


def planned_checks(caps: Any) -> tuple[str, ...]:
    return ("processes started, ranks unique", "each process on its own expected device",
            "batch size per process and global", *training_checks(caps),
            "metric gathering sees every evaluation sample exactly once",
            "save/load round-trip reproduces the next step's loss",
            "data position after load_state follows the run's semantics")


class _Results:
    """Check results, rewritten to the output file (by process 0) after each one, so a job that dies
    midway still tells which checks passed and which one broke."""

    def __init__(self, out: Path, writer: bool, planned: tuple[str, ...]):
        self.out, self.writer, self.planned, self.items = out, writer, planned, []
        self.precision: dict | None = None
        self._write()

    def add(self, name: str, ok: bool, measured: Any, expected: Any) -> None:
        self.items.append({"check": name, "ok": bool(ok), "measured": str(measured), "expected": str(expected)})
        self._write()

    def set_precision(self, comparison: dict) -> None:
        self.precision = comparison
        self._write()

    def _write(self) -> None:
        if self.writer:
            data = {"planned": list(self.planned), "results": self.items}
            if self.precision is not None:
                data["precision"] = self.precision
            self.out.write_text(json.dumps(data, indent=2))


def run(out: Path, expected_world: int | None, expected_device: str | None) -> None:
    acc = Accelerator()
    caps = acc._runtime.capabilities
    checks = planned_checks(caps)
    results = _Results(out, acc.is_main_process, checks)
    check = results.add
    current = {"name": checks[0]}

    def failing(exc: BaseException) -> None:
        """A check raised: record it as failed and leave (the other processes then fail fast too)."""
        check(current["name"], False, f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
              "no error")
        lifecycle.record_error(type(exc), exc, exc.__traceback__)
        lifecycle.fail(1)

    try:
        _run_checks(acc, caps, checks, check, current, expected_world, expected_device, results)
    except Exception as exc:  # noqa: BLE001 - any failure is a check result
        failing(exc)


def _run_checks(acc: Accelerator, caps: Any, checks: tuple[str, ...], check: Any, current: dict,
                expected_world: int | None, expected_device: str | None, results: _Results) -> None:
    world, rank = acc.num_processes, acc.process_index
    current["name"] = checks[0]
    ranks = acc._gather_objects(rank)
    want_world = expected_world or world
    check(checks[0], sorted(ranks) == list(range(want_world)) and world == want_world,
          f"{world} processes, ranks {sorted(ranks)}", f"{want_world} processes, ranks 0..{want_world - 1}")

    current["name"] = checks[1]
    places = acc._gather_objects((socket.gethostname(), acc.local_process_index, str(acc.device)))
    accelerators = [(host, dev) for host, _, dev in places if not dev.startswith("cpu")]
    kinds = sorted({dev.split(":")[0] for _, _, dev in places})
    device_ok = len(accelerators) == len(set(accelerators)) and (expected_device is None or kinds == [expected_device])
    check(checks[1], device_ok, ", ".join(d for _, _, d in places),
          f"{expected_device or 'any'}; no two processes on one accelerator")

    current["name"] = checks[2]
    periodic = caps.sync == "periodic"
    # a periodic backend trains whole periods (at least STEPS steps), so the checks see synchronisations
    steps = -(-STEPS // caps.sync_period) * caps.sync_period if periodic else STEPS
    set_seed(0)
    model = _model()
    reference = copy.deepcopy(model)  # same initial weights, trained in plain torch on the global batches
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    loader = DataLoader(_data(max(SAMPLES, BATCH * world * (steps + 2))), batch_size=BATCH, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)

    sizes, losses, ref_losses, grads_agree, replicas = [], [], [], [], []
    it = iter(loader)
    for step in range(1, steps + 1):
        x, y = next(it)
        sizes.append(acc._gather_objects(int(x.shape[0])))
        loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        fingerprints = acc._gather_objects(_fingerprint(acc.unwrap_model(model)))
        grads_agree.append(all(fp == fingerprints[0] for fp in fingerprints))
        opt.step()
        opt.zero_grad()
        skipped = acc.optimizer_step_was_skipped  # fp16: overflowed gradients skip the step; so does the reference
        if periodic and step % caps.sync_period == 0:
            params = acc._gather_objects(_params_fingerprint(acc.unwrap_model(model)))
            replicas.append((step, max(abs(a - b) for p in params for a, b in zip(p, params[0]))))
        losses.append(float(acc.reduce(loss.detach().float(), "mean")))
        gx, gy = acc.gather((x, y))
        ref_loss = nn.functional.mse_loss(reference(gx.float().cpu()), gy.float().cpu())
        ref_loss.backward()
        if not skipped:
            ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(float(ref_loss.detach()))

    per_process = sizes[0][0] if sizes and sizes[0] else None
    batch_ok = all(s == [BATCH] * world for s in sizes)
    check(checks[2], batch_ok, f"per process {per_process}, global {sum(sizes[0])}",
          f"per process {BATCH}, global {BATCH * world}")

    if periodic:  # replicas apart between synchronisations, equal at each one
        current["name"] = checks[3]
        worst = max((d for _, d in replicas), default=0.0)
        check(checks[3], bool(replicas) and worst <= 1e-6,
              "; ".join(f"step {s}: max difference {d:.2e}" for s, d in replicas) or "no synchronisation seen",
              f"<= 1e-06 at steps {', '.join(str(s) for s in range(caps.sync_period, steps + 1, caps.sync_period))}")
        current["name"] = checks[4]
        local = [not agree for agree in grads_agree]
        check(checks[4], world == 1 or all(local),
              f"{sum(local)} of {len(local)} steps had per-process gradients" if world > 1 else "1 process",
              "every step (no gradient averaging)")
    else:
        mixed = acc.mixed_precision != "no"
        tolerance = 5e-2 if mixed else 1e-4
        worst = max(abs(a - b) / max(abs(b), 1e-8) for a, b in zip(losses, ref_losses))
        check(checks[3], worst <= tolerance,
              f"max relative difference {worst:.2e} (losses {', '.join(f'{v:.5f}' for v in losses)})",
              f"<= {tolerance:.0e}")
        check(checks[4], all(grads_agree), f"{sum(grads_agree)} of {len(grads_agree)} steps agree", "every step")

    current["name"] = checks[5]
    eval_loader = acc.prepare(DataLoader(TensorDataset(torch.arange(EVAL_SAMPLES)), batch_size=EVAL_BATCH))
    seen: list[int] = []
    for (ids,) in eval_loader:
        seen.extend(int(i) for i in acc.gather_for_metrics(ids))
    check(checks[5], seen == list(range(EVAL_SAMPLES)),
          f"{len(seen)} samples, {len(set(seen))} distinct" + ("" if seen == sorted(seen) else ", out of order"),
          f"{EVAL_SAMPLES} samples, each once, in order")

    current["name"] = checks[6]
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
    check(checks[6], before == after, f"{after!r} after load",
          f"{before!r} (bitwise)")

    current["name"] = checks[7]
    exact = acc.settings["resume_data_position"]
    x_next, _ = next(iter(loader))
    epoch, taken = loader.position()
    if exact:  # acc's exact resume: the data continue with the batch that followed the save
        ok, measured = torch.equal(x_next, x) and taken == steps + 1, f"continued with batch {taken} of epoch {epoch}"
        expected = f"batch {steps + 1} (the one after the save), resume_data_position = true"
    else:  # Accelerate's: the epoch starts again (scripts skip what they trained, with skip_first_batches)
        ok, measured = taken == 1, f"started again at batch {taken} of epoch {epoch}"
        expected = "batch 1 of the epoch (resume_data_position = false: the script skips batches itself)"
    check(checks[7], ok, measured, expected)
    if acc.mixed_precision != "no":
        if acc.is_main_process:  # alone, so the other processes do not compete for the device or the cores
            results.set_precision(_precision_comparison(acc))
    acc.wait_for_everyone()
    if acc.is_main_process:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    acc.end_training()


COMPARE_ROUNDS, COMPARE_STEPS, LOSS_STEPS = 5, 2, 4


def _precision_comparison(acc: Accelerator) -> dict:
    """What the run's mixed precision costs and changes here (never raises: an error is the result)."""
    from acc.runtime.precision_support import native_support

    mode, precision = acc.mixed_precision, acc._precision
    device = acc.device
    try:
        native, why = native_support(mode, device)
    except Exception as exc:  # noqa: BLE001 - a device that cannot be queried is "unknown"
        native, why = None, f"could not tell: {type(exc).__name__}: {exc}"
    base = {"mode": mode, "device": str(device), "native": native, "support": why}
    if not precision.native and not precision.active:
        return {**base, "skipped": f"mixed_precision '{mode}' trains in float32 on {device.type} in this run "
                f"(set --fp16-on-cpu to measure float16 autocast there)" if mode == "fp16" else
                "mixed precision is off in this run (native_amp = False)"}
    if device.type not in ("cpu", "cuda", "mps", "xpu"):
        return {**base, "skipped": f"not measured on {device.type} devices"}
    try:
        result = compare_precision(mode, device)
    except Exception as exc:  # noqa: BLE001 - the mode failing here is the finding
        return {**base, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
    if precision.native:
        result["note"] = (f"the {acc.backend} backend applies {mode} itself; measured here with acc's autocast "
                          "recipe on the same device")
    return {**base, **result}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def compare_precision(mode: str, device: torch.device, rounds: int = COMPARE_ROUNDS,
                      steps: int = COMPARE_STEPS) -> dict:
    """A training step (transformer block, AdamW) in `mode` (acc's recipe: autocast, outputs in float32, a
    gradient scaler for fp16) against float32, from the same initial weights on the same data: the loss
    difference over the first LOSS_STEPS steps, then the step-time ratio, the median of `rounds` alternating
    repeats of `steps` steps each (mixed first in even rounds, float32 first in odd ones)."""
    from acc.runtime.precision import Precision

    big = device.type == "cuda"  # a GPU needs a larger step to be measured rather than its launch overhead
    d_model, heads, ff, batch, tokens = (512, 8, 2048, 32, 256) if big else (128, 4, 512, 4, 64)
    g = torch.Generator().manual_seed(11)
    torch.manual_seed(11)
    fp32_model = nn.Sequential(nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True),
                               nn.Linear(d_model, d_model)).to(device)
    mixed_model = copy.deepcopy(fp32_model)
    x = torch.randn(batch, tokens, d_model, generator=g).to(device)
    y = torch.randn(batch, tokens, d_model, generator=g).to(device)
    scaler = torch.amp.GradScaler(device.type) if mode == "fp16" else None
    precision = Precision(mode, device, scaler=scaler)
    precision.patch_forward(mixed_model)
    plain = Precision("no", device)
    runs = {"mixed": (mixed_model, torch.optim.AdamW(mixed_model.parameters(), lr=1e-3), precision),
            "fp32": (fp32_model, torch.optim.AdamW(fp32_model.parameters(), lr=1e-3), plain)}

    def step(name: str) -> float:
        model, opt, prec = runs[name]
        loss = nn.functional.mse_loss(model(x), y)
        prec.scale_loss(loss).backward()
        prec.step(opt, opt.step)
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    losses: dict[str, list[float]] = {"mixed": [], "fp32": []}
    for _ in range(LOSS_STEPS):  # also the warm-up of both
        for name in ("mixed", "fp32"):
            losses[name].append(float(step(name)))
    times: dict[str, list[float]] = {"mixed": [], "fp32": []}
    for r in range(rounds):
        for name in (("mixed", "fp32") if r % 2 == 0 else ("fp32", "mixed")):
            _sync(device)
            start = time.perf_counter()
            for _ in range(steps):
                step(name)
            _sync(device)
            times[name].append((time.perf_counter() - start) / steps)
    mixed_s, fp32_s = statistics.median(times["mixed"]), statistics.median(times["fp32"])
    diffs = [abs(a - b) for a, b in zip(losses["mixed"], losses["fp32"])]
    rel = [d / max(abs(b), 1e-12) for d, b in zip(diffs, losses["fp32"])]
    return {"ratio": mixed_s / fp32_s, "mixed_s_per_step": mixed_s, "fp32_s_per_step": fp32_s, "rounds": rounds,
            "steps_per_round": steps, "loss_steps": LOSS_STEPS, "losses_mixed": losses["mixed"],
            "losses_fp32": losses["fp32"], "loss_max_abs_diff": max(diffs), "loss_max_rel_diff": max(rel),
            "finite": all(v == v and abs(v) != float("inf") for v in losses["mixed"]),
            "model": f"transformer block d_model {d_model}, {heads} heads, ff {ff}, batch {batch} x {tokens} tokens, "
                     "AdamW"}


def main() -> None:
    parser = argparse.ArgumentParser(description="acc check job (run by `acc check`)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--expected-world", type=int, default=None)
    parser.add_argument("--expected-device", default=None)
    args = parser.parse_args()
    run(Path(args.out), args.expected_world, args.expected_device)


if __name__ == "__main__":
    main()
