"""Functions launched with `acc.launch` (imported by the tests), and a plain script that launches them:

    python launch_fn.py values|fail|interrupt|interrupt-in-clock|sources OUT_DIR
    python launch_fn.py nodes OUT_DIR NODE_RANK PORT

Its functions are defined in `__main__` when run as a script, so the launches fork them without pickling.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `tests.workers` importable from a script


def describe_rank(tag: str) -> dict:
    """What a worker sees: its rank, the world, its backend and pid, the settings of its run (value, source)."""
    from acc import Accelerator

    accelerator = Accelerator()
    s = accelerator.settings
    seen = {name: [s[name], s.source(name)] for name in ("backend", "nproc", "mixed_precision", "timeout",
                                                            "monitor_interval", "gradient_accumulation_steps",
                                                            "main_process_port", "cpu")}
    total = accelerator.reduce(__import__("torch").tensor([float(accelerator.process_index + 1)]), "sum")
    return {"tag": tag, "rank": accelerator.process_index, "world": accelerator.num_processes, "pid": os.getpid(),
            "ppid": os.getppid(), "distributed_type": str(accelerator.distributed_type), "sum": float(total),
            "settings": seen}


def fail_on_rank_one() -> None:
    from acc import Accelerator

    accelerator = Accelerator()
    if accelerator.process_index == 1:
        raise ValueError("bad batch on rank 1")
    accelerator.wait_for_everyone()


def sleep_forever(out_dir: str) -> None:
    """Write this worker's pid to OUT/pid<rank>, then sleep (the test interrupts the launch)."""
    from acc import Accelerator

    accelerator = Accelerator()
    Path(out_dir, f"pid{accelerator.process_index}").write_text(str(os.getpid()))
    time.sleep(3600)


def sigint_inside_torchs_metric_clock(out_dir: str) -> None:
    """Make SIGINT reach this (launching) process inside the clock read of torch's metric timer (`metrics.prof`,
    which wraps the agent's monitoring) once both workers of `sleep_forever(out_dir)` are running: the handler the
    agent installed raises there, between the timer's `try` and its assignment, as a real Ctrl-C can."""
    import signal

    import torch.distributed.elastic.metrics.api as metrics_api

    pids = [Path(out_dir, f"pid{rank}") for rank in (0, 1)]

    class Clock:
        fired = False

        def __getattr__(self, name: str):
            return getattr(time, name)

        def time(self) -> float:
            if not Clock.fired and all(p.is_file() and p.read_text() for p in pids):
                Clock.fired = True
                os.kill(os.getpid(), signal.SIGINT)  # its handler runs at the next bytecode boundary: in here
            return time.time()

    metrics_api.time = Clock()


def fail_once(marker: str) -> dict:
    """Rank 1 fails in the first round; the restarted round succeeds (max_restarts)."""
    from acc import Accelerator

    accelerator = Accelerator()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart == 0 and accelerator.process_index == 1:
        Path(marker).write_text("failed once")
        raise RuntimeError("first round fails")
    accelerator.wait_for_everyone()
    spawned = b"spawn_main" in Path("/proc/self/cmdline").read_bytes()  # a fresh interpreter, not a fork
    return {"rank": accelerator.process_index, "restart": restart, "spawned": spawned}


def train_regression(batch_size: int, epochs: int = 2) -> dict:
    """A seeded linear regression (SGD, a StepLR schedule, shuffled data): the final weights, every step's LR and
    the samples each optimizer step trained on (gathered), for the parity check."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from acc import Accelerator, set_seed

    accelerator = Accelerator()
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(64, 1, generator=g)
    ids = torch.arange(64, dtype=torch.float32).unsqueeze(1)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    loader = DataLoader(TensorDataset(x, y, ids), batch_size=batch_size, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    lrs, seen = [], []
    for _ in range(epochs):
        for xb, yb, idb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            lrs.append(optimizer.param_groups[0]["lr"])
            seen.append(sorted(int(i) for i in accelerator.gather(idb.squeeze(1))))
    weights = accelerator.unwrap_model(model).state_dict()
    return {"world": accelerator.num_processes, "weights": {k: v.detach().clone() for k, v in weights.items()},
            "lrs": lrs, "seen": seen}


def main() -> None:
    import acc

    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    if mode == "values":
        result["main"] = acc.launch(describe_rank, "first", backend="ddp", nproc=2)
        result["all"] = acc.launch(describe_rank, "second", backend="ddp", nproc=2, return_all=True)
        result["lambda"] = acc.launch(lambda: os.getppid(), backend="ddp", nproc=2, return_all=True)
    elif mode == "fail":
        try:
            acc.launch(fail_on_rank_one, backend="ddp", nproc=2)
        except acc.WorkerFailedError as exc:
            result = {"rank": exc.rank, "local_rank": exc.local_rank, "exitcode": exc.exitcode, "error": exc.error,
                      "traceback": exc.traceback, "report": str(exc), "failures": exc.failures}
        result["after"] = acc.launch(describe_rank, "after a failure", backend="ddp", nproc=2)
    elif mode == "interrupt":
        try:
            acc.launch(sleep_forever, str(out), backend="ddp", nproc=2)
        except KeyboardInterrupt:
            result["interrupted"] = True
        result["after"] = acc.launch(describe_rank, "after an interrupt", backend="ddp", nproc=2)
    elif mode == "interrupt-in-clock":
        sigint_inside_torchs_metric_clock(str(out))
        try:
            acc.launch(sleep_forever, str(out), backend="ddp", nproc=2)
        except KeyboardInterrupt:
            result["interrupted"] = True
        result["workers"] = [int((out / f"pid{r}").read_text()) for r in (0, 1)]
    elif mode == "sources":
        result["main"] = acc.launch(describe_rank, "sources", nproc=2, gradient_accumulation_steps=3)
        result["dry_run"] = str(acc.launch(describe_rank, "sources", nproc=2, gradient_accumulation_steps=3,
                                           dry_run=True))
    elif mode == "nodes":  # python launch_fn.py nodes OUT NODE_RANK PORT: one of two "machines" on this host
        result["main"] = acc.notebook_launcher(describe_rank, args=(f"node {sys.argv[3]}",), num_processes=1,
                                               num_nodes=2, node_rank=int(sys.argv[3]), use_port=sys.argv[4])
    result["launcher_pid"] = os.getpid()
    (out / "result.json").write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
