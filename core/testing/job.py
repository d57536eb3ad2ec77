"""The conformance job: run inside each process of a launch, it exercises a backend through the public API and
records what came back, for `acc.testing`'s suite to judge against the backend's declared capabilities.

    acc launch --backend NAME --nproc N -m acc.testing.job --out DIR --phase contract|train|accumulate [...]

Phases:
- contract: every hook through the API (acc_init_module's answer, prepare, backward, clipping, no_sync, the collectives, save/load) with
  the types of their answers, and what the collectives returned.
- train: Adam on a small model with seeded shuffling (acc's semantics), checkpoints at several steps; every rank
  records its parameters after each step, its parameters and Adam state at each save and after loading each
  save, and the two steps after loading the first save. `--load-final DIR` (one process) loads another run's
  final checkpoint and records its parameters (resharding).
- accumulate: two accumulation cycles of two micro-steps: per micro-step, whether gradients synchronised, how
  many gradient collectives ran (counted by torch's profiler), and this rank's gradients.
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

from acc.accelerator import Accelerator
from acc.runtime.seeding import set_seed

SAMPLES, BATCH = 50, 4
TRAIN_SAMPLES = 128
GRADIENT_COLLECTIVES = ("all_reduce", "allreduce", "reduce_scatter")


def _record(results: dict, name: str, fn: Callable[[], Any]) -> Any:
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - a failing hook is a finding, recorded by name
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        return None
    results[name] = {"ok": True}
    return value


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def _data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True).tanh() + 0.1 * torch.randn(n, 1, generator=g), torch.arange(n))


def _full(t: torch.Tensor) -> torch.Tensor:
    """A tensor whole (a sharded DTensor gathered; every process calls this alike)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _params(accelerator: Accelerator, model: Any) -> list[float]:
    return torch.cat([_full(p.detach()).float().flatten().cpu()
                      for p in accelerator.unwrap_model(model).parameters()]).tolist()


def _adam(optimizer: Any) -> list[float]:
    """This process's Adam state: the sum of each moment of each parameter (its own shard when sharded)."""
    out = []
    for state in optimizer.optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                out.append(float(_local(state[key]).double().sum()))
    return out


def run_contract(out: Path) -> None:
    acc = Accelerator(semantics="acc")
    rank, world = acc.process_index, acc.num_processes
    types: dict[str, Any] = {}
    info = acc.ctx.process
    types["acc_setup"] = {"ok": info is not None and info.num_processes == world and 0 <= rank < world,
                          "device": str(acc.device)}
    from acc.runtime.init_module import ShardedBuild

    build = _record(types, "acc_init_module", lambda: acc._hooks.acc_init_module(ctx=acc.ctx, empty_init=None))
    if types["acc_init_module"]["ok"] and not (build is None or isinstance(build, ShardedBuild)):
        types["acc_init_module"] = {"ok": False, "error": f"answered {type(build).__name__}, not a ShardedBuild or None"}
    set_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = _data(SAMPLES)
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
    comm = acc.ctx.communicator
    collectives = {
        "gather": _record(types, "all_gather", lambda: acc.gather(torch.tensor([float(rank)] * 2)).tolist()),
        "gather_object": _record(types, "gather_object", lambda: comm.gather_object({"rank": rank})),
        "reduce_sum": _record(types, "all_reduce", lambda: acc.reduce(torch.tensor([rank + 1.0]), "sum").tolist()),
        "reduce_mean": acc.reduce(torch.tensor([rank + 1.0]), "mean").tolist(),
        "reduce_max": acc.reduce(torch.tensor([rank + 1.0]), "max").tolist(),
        "reduce_min": acc.reduce(torch.tensor([rank + 1.0]), "min").tolist(),
        "broadcast": _record(types, "broadcast",
                             lambda: acc.broadcast(torch.tensor([float(rank)]), from_process=world - 1).tolist()),
        "broadcast_object": _record(types, "broadcast_object", lambda: acc.broadcast_object(f"from {rank}")),
        "broadcast_none": acc.broadcast_object(None if rank == 0 else "x"),
    }
    _record(types, "barrier", acc.wait_for_everyone)

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
                      "round_trip": {"before": before, "after": after}, "mesh": _mesh_checks(acc)})
    acc.end_training()


def _mesh_checks(acc: Accelerator) -> dict[str, Any]:
    """For each data-parallel mesh dim the backend declares it drives: the mesh a ParallelismConfig of that dim
    over every process builds on this run (what Accelerator(parallelism_config=...) checks and builds), its names
    and the sum of rank + 1 over its `dp` group."""
    from acc.compat.parallelism_objects import ParallelismConfig
    from acc.runtime.parallelism import check_parallelism

    caps, world, found = _capabilities(acc), acc.num_processes, {}
    for dim in caps.mesh_dims:
        if dim not in ("dp_replicate", "dp_shard") or world < 2:
            continue
        try:
            config = check_parallelism(ParallelismConfig(**{f"{dim}_size": world}), world, acc.backend, caps,
                                       acc.settings)
            mesh = config.build_device_mesh(acc.device.type)
            total = torch.tensor([acc.process_index + 1.0], device=acc.device)
            torch.distributed.all_reduce(total, group=mesh["dp"].get_group())
            found[dim] = {"names": list(mesh.mesh_dim_names), "dp_sum": float(total.item())}
        except Exception as exc:  # noqa: BLE001 - recorded: the suite says what failed
            found[dim] = {"error": f"{type(exc).__name__}: {exc}"}
    return found


def _capabilities(acc: Accelerator) -> Any:
    return acc._runtime.capabilities


def save_points(caps: Any, steps: int) -> list[int]:
    """Steps after which the train phase saves: mid-epoch, and right before and right after a sync."""
    period = caps.sync_period if caps.sync == "periodic" else 4
    return sorted({p for p in (3, period - 1, period) if 1 <= p <= steps - 2})


def run_train(out: Path, batch: int, steps: int, load_final: str | None) -> None:
    acc = Accelerator(semantics="acc")
    rank = acc.process_index
    caps = _capabilities(acc)
    set_seed(0)
    model = _model()
    model_opt = torch.optim.Adam(model.parameters(), lr=0.02)
    sched = torch.optim.lr_scheduler.LambdaLR(model_opt, lambda s: 1.0 / (1 + 0.1 * s))
    loader = DataLoader(_data(TRAIN_SAMPLES), batch_size=batch, shuffle=True)
    model, opt, loader, sched = acc.prepare(model, model_opt, loader, sched)
    record: dict[str, Any] = {"world": acc.num_processes, "capabilities": caps.__dict__ | {"notes": list(caps.notes)}}
    if load_final:  # resharding: another run's final checkpoint, loaded here
        acc.load_state(load_final)
        record["loaded_final"] = _params(acc, model)
        _dump(out, rank, record)
        acc.end_training()
        return
    points = save_points(caps, steps)
    directory = Path(acc.broadcast_object(tempfile.mkdtemp(prefix="acc-kit-") if acc.is_main_process else None))
    after_step, losses, ids, saved = [], [], [], {}

    dtype = next(acc.unwrap_model(model).parameters()).dtype  # DeepSpeed's bf16/fp16 modes expect inputs in it

    def train(count: int, into_losses: list, into_ids: list | None = None, params: list | None = None) -> None:
        done = 0
        while done < count:
            for x, y, idx in loader:
                loss = nn.functional.mse_loss(model(x.to(dtype)).float(), y)
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
                into_losses.append(float(loss.detach()))
                if into_ids is not None:
                    into_ids.append(idx.tolist())
                if params is not None:
                    params.append(_params(acc, model))
                done += 1
                step = acc.applied_steps
                if step in points and params is not None and str(step) not in saved:
                    acc.save_state(directory / f"ckpt_{step}")
                    saved[str(step)] = {"params": _params(acc, model), "adam": _adam(opt)}
                if done == count:
                    break

    train(steps, losses, ids, after_step)
    acc.save_state(directory / "final")
    record.update({"losses": losses, "ids": ids, "after_step": after_step, "saved": saved, "points": points,
                   "final": _params(acc, model), "final_dir": str(directory / "final")})
    loaded, resumed = {}, {}
    for point in points:
        acc.load_state(directory / f"ckpt_{point}")
        loaded[str(point)] = {"params": _params(acc, model), "adam": _adam(opt)}
        if point == points[0]:
            continued: list[float] = []
            train(2, continued)
            resumed = {"point": point, "losses": continued}
    record.update({"loaded": loaded, "resumed": resumed})
    _dump(out, rank, record)
    acc.end_training()


def run_accumulate(out: Path, batch: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    acc = Accelerator(semantics="acc", gradient_accumulation_steps=2)
    rank = acc.process_index
    set_seed(0)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    loader = DataLoader(_data(TRAIN_SAMPLES), batch_size=batch, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    micro = []
    for i, (x, y, _) in enumerate(loader):
        if i == 4:
            break
        with acc.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                acc.backward(loss)
            names = [e.name.lower() for e in prof.events()]
            grads = [float(_local(p.grad).double().sum()) if p.grad is not None else None
                     for p in acc.unwrap_model(model).parameters()]
            micro.append({"sync": acc.sync_gradients, "grads": grads,
                          "gradient_collectives": sum(any(k in n for k in GRADIENT_COLLECTIVES) for n in names)})
            opt.step()
            opt.zero_grad()
    _dump(out, rank, {"world": acc.num_processes, "micro": micro})
    acc.end_training()


def _dump(out: Path, rank: int, payload: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(payload, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description="acc conformance job (run by acc.testing)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--phase", default="contract", choices=("contract", "train", "accumulate"))
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--load-final", default=None)
    args = parser.parse_args()
    out = Path(args.out)
    if args.phase == "contract":
        run_contract(out)
    elif args.phase == "train":
        run_train(out, args.batch, args.steps, args.load_final)
    else:
        run_accumulate(out, args.batch)


if __name__ == "__main__":
    main()
