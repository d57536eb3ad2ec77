"""The conformance job: run inside each process of a launch, it exercises every selection hook through the
public API and records what came back, for `acc.testing`'s suite to judge.

    acc launch --backend NAME --nproc N -m acc.testing.job --out DIR
Each process writes DIR/rank<N>.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ..accelerator import Accelerator
from ..seed import set_seed

SAMPLES, BATCH = 50, 4


def _record(results: dict, name: str, fn: Callable[[], Any]) -> Any:
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - a failing hook is a finding, recorded by name
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        return None
    results[name] = {"ok": True}
    return value


def run(out: Path) -> None:
    acc = Accelerator()
    rank, world = acc.process_index, acc.num_processes
    types: dict[str, Any] = {}
    info = acc.ctx.process
    types["acc_setup"] = {"ok": info is not None and info.num_processes == world and 0 <= rank < world,
                          "device": str(acc.device)}

    set_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(SAMPLES, 6, generator=g), torch.randn(SAMPLES, 1, generator=g),
                         torch.arange(SAMPLES))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    prepared = _record(types, "acc_wrap", lambda: acc.prepare(model, opt, loader))
    if prepared is None:
        _dump(out, rank, {"types": types})
        return
    model, opt, loader = prepared
    types["acc_wrap_dataloader"] = {"ok": hasattr(loader, "__iter__")}
    types["acc_unwrap_model"] = {"ok": isinstance(acc.unwrap_model(model), nn.Module)}

    def enter_no_sync() -> None:
        with acc.no_sync(model):
            pass

    _record(types, "acc_no_sync", enter_no_sync)

    losses = []
    for x, y, _ in loader:
        loss = nn.functional.mse_loss(model(x), y)
        _record(types, "acc_backward", lambda: acc.backward(loss))
        norm = _record(types, "acc_clip_grad_norm", lambda: acc.clip_grad_norm_(model.parameters(), 1e6))
        types["acc_clip_grad_norm"]["ok"] &= isinstance(norm, torch.Tensor)
        _record(types, "acc_optimizer_step", lambda: opt.step())
        opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach().float(), "mean")))

    eval_loader = acc.prepare(DataLoader(TensorDataset(torch.arange(SAMPLES)), batch_size=BATCH))
    seen: list[int] = []
    for (ids,) in eval_loader:
        seen.extend(int(i) for i in acc.gather_for_metrics(ids))

    collectives = {
        "gather": _record(types, "acc_all_gather", lambda: acc.gather(torch.tensor([float(rank)] * 2)).tolist()),
        "gather_object": _record(types, "acc_gather_object", lambda: acc._gather_objects({"rank": rank})),
        "reduce_sum": _record(types, "acc_all_reduce", lambda: acc.reduce(torch.tensor([rank + 1.0]), "sum").tolist()),
        "reduce_max": acc.reduce(torch.tensor([rank + 1.0]), "max").tolist(),
        "broadcast": _record(types, "acc_broadcast",
                             lambda: acc.broadcast(torch.tensor([float(rank)]), from_process=world - 1).tolist()),
        "broadcast_object": _record(types, "acc_broadcast_object", lambda: acc.broadcast_object(f"from {rank}")),
    }
    _record(types, "acc_barrier", acc.wait_for_everyone)

    directory = acc.broadcast_object(tempfile.mkdtemp(prefix="acc-conformance-") if acc.is_main_process else None)
    ckpt = Path(directory) / "ckpt"
    _record(types, "acc_save_checkpoint", lambda: acc.save_state(ckpt))
    probe = torch.randn(3, 6, generator=torch.Generator().manual_seed(2)).to(acc.device)
    with torch.no_grad():
        before = acc.gather(model(probe).float()).tolist()
    for p in acc.unwrap_model(model).parameters():  # spoil the weights: loading must restore them
        with torch.no_grad():
            p.add_(1.0)
    _record(types, "acc_load_checkpoint", lambda: acc.load_state(ckpt))
    with torch.no_grad():
        after = acc.gather(model(probe).float()).tolist()
    state = _record(types, "acc_model_state_dict", lambda: acc.get_state_dict(model))
    if state is not None and rank == 0:
        types["acc_model_state_dict"]["ok"] = bool(state) and all(isinstance(v, torch.Tensor) for v in state.values())
    acc.wait_for_everyone()
    _dump(out, rank, {"types": types, "world": world, "losses": losses, "seen": seen, "collectives": collectives,
                      "round_trip": {"before": before, "after": after}})
    acc.end_training()


def _dump(out: Path, rank: int, payload: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(payload, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description="acc conformance job (run by acc.testing)")
    parser.add_argument("--out", required=True)
    run(Path(parser.parse_args().out))


if __name__ == "__main__":
    main()
