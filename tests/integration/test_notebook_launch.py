"""A real notebook, written here and executed with nbclient on an ipykernel kernel of this venv's python: a cell
defines a training function and launches it on 2 ddp processes with `notebook_launcher`, a cell raises a worker's
exception with its traceback, a kernel interrupt during a long launch leaves no worker (checked in the process
table), and a relaunch in the same kernel (on fsdp) works.

The kernel is registered for this test only (a kernel spec in tmp_path handed to the kernel manager); every Jupyter
and IPython directory points into tmp_path, so the user's Jupyter configuration is neither read nor written.
nbclient and ipykernel are test tools (scripts/bootstrap.sh installs them), not acc dependencies.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import clean_env
from tests.waiting import is_pid, wait_for_text

pytestmark = pytest.mark.slow

SETUP = """\
import json, os, time
import acc
kernel_pid = os.getpid()
print("kernel", kernel_pid)
"""

TRAIN = """\
def train(epochs):
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from acc import Accelerator, set_seed

    accelerator = Accelerator()
    set_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(339, 2, generator=g)
    y = (x[:, 0] + 2 * x[:, 1] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    train_loader = DataLoader(TensorDataset(x[:256], y[:256]), batch_size=16, shuffle=True)
    eval_loader = DataLoader(TensorDataset(x[256:], y[256:]), batch_size=10)  # 83 samples: the last batch is short
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)
    for _ in range(epochs):
        for xb, yb in train_loader:
            accelerator.backward(torch.nn.functional.cross_entropy(model(xb), yb))
            optimizer.step()
            optimizer.zero_grad()
    print(f"rank {accelerator.process_index} trained", flush=True)
    correct = []
    with torch.no_grad():
        for xb, yb in eval_loader:
            correct.append(accelerator.gather_for_metrics((model(xb).argmax(1) == yb).float()))
    correct = torch.cat(correct)
    s = accelerator.settings
    return {"world": accelerator.num_processes, "backend": accelerator.backend, "evaluated": len(correct),
            "accuracy": float(correct.mean()), "timeout": [s["timeout"], s.source("timeout")]}

result = acc.notebook_launcher(train, args=(4,), num_processes=2)
print("metric", json.dumps(result))
"""

FAILS = """\
def fails():
    from acc import Accelerator

    accelerator = Accelerator()
    if accelerator.process_index == 1:
        raise ValueError("bad batch on rank 1")
    accelerator.wait_for_everyone()

acc.notebook_launcher(fails, num_processes=2)
"""

LONG = """\
def long_training(out):
    from acc import Accelerator

    accelerator = Accelerator()
    with open(f"{out}/pid{accelerator.process_index}", "w") as fp:
        fp.write(str(os.getpid()))
    while True:  # in a collective most of the time, as training is
        accelerator.wait_for_everyone()
        time.sleep(0.02)

acc.notebook_launcher(long_training, args=(OUT,), num_processes=2)  # the test interrupts the kernel here
"""

AGAIN = """\
again = acc.launch(train, 2, backend="fsdp", nproc=2)
print("again", json.dumps(again))
"""

CHILDREN = """\
def children_of(pid):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fp:
                    fields = fp.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append((int(name), fields[0]))
    return found

print("children", json.dumps(children_of(kernel_pid)))
"""


def _state(pid: int) -> str | None:
    """The process's state letter (Z: zombie), None when it no longer exists."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


async def _pids_written(out: Path, cell: asyncio.Future, timeout: float = 120) -> bool:
    """Whether both workers wrote their pid to OUT/pid<rank> before the cell ended or the timeout passed (the wait
    runs in a thread, on inotify; a pipe written when the cell ends first ends it). A file exists before its
    writer wrote into it: the wait is for its text."""
    stop_r, stop_w = os.pipe()
    try:
        with open(stop_r, "rb", buffering=0, closefd=False) as stop:
            waiting = asyncio.ensure_future(asyncio.to_thread(wait_for_text, [out / "pid0", out / "pid1"], timeout,
                                                              ended=[stop], complete=is_pid))
            await asyncio.wait({waiting, cell}, return_when=asyncio.FIRST_COMPLETED)
            os.write(stop_w, b".")  # the cell ended first (or the wait is over anyway)
            return await waiting
    finally:
        os.close(stop_r)
        os.close(stop_w)


def _jupyter_dirs(tmp_path: Path) -> dict[str, str]:
    dirs = {name: tmp_path / "jupyter" / name.lower() for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR",
                                                                  "JUPYTER_RUNTIME_DIR", "IPYTHONDIR")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    return {**{k: str(v) for k, v in dirs.items()}, "JUPYTER_PATH": str(tmp_path / "jupyter" / "data"),
            "JUPYTER_PLATFORM_DIRS": "1"}


def _outputs(cell, kind: str) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == kind)


def _error(cell):
    errors = [o for o in cell.outputs if o.output_type == "error"]
    return errors[0] if errors else None


def _line(cell, prefix: str):
    for line in _outputs(cell, "stdout").splitlines():
        if line.startswith(prefix + " "):
            return json.loads(line[len(prefix) + 1:])
    raise AssertionError(f"no '{prefix}' line in the cell's output: {cell.outputs}")


@pytest.mark.parametrize("fd_capture", [True, False], ids=["kernel-captures-descriptors", "streams-only"])
def test_a_notebook_trains_on_two_processes_fails_with_the_traceback_survives_an_interrupt_and_relaunches(
        tmp_path, monkeypatch, fd_capture):
    """Both ways a kernel shows output: by default ipykernel also captures descriptors 1 and 2 (and its
    sys.stdout has a descriptor); with capture_fd_output off, sys.stdout has none."""
    try:
        import nbformat
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import AsyncKernelManager
        from nbclient import NotebookClient
    except ImportError as exc:  # bootstrap installs them: a missing one is a broken test venv, not a skip
        pytest.fail(f"{exc}: nbclient and ipykernel are test tools; run scripts/bootstrap.sh")

    jupyter = _jupyter_dirs(tmp_path)
    for key, value in jupyter.items():  # the kernel manager's connection files and lookups stay in tmp_path too
        monkeypatch.setenv(key, value)
    spec = tmp_path / "kernels" / "acc-test-venv"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 f"--IPKernelApp.capture_fd_output={fd_capture}"],
        "display_name": "acc test venv", "language": "python", "interrupt_mode": "signal"}))
    (tmp_path / "acc.toml").write_text("timeout = 321\n")  # settings from acc.toml apply in the notebook
    out = tmp_path / "pids"
    out.mkdir()
    cells = [SETUP, TRAIN, FAILS, f"OUT = {str(out)!r}\n" + LONG, AGAIN, CHILDREN]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    km = AsyncKernelManager(kernel_name="acc-test-venv",
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")]))
    client = NotebookClient(nb, km=km, timeout=240, allow_errors=True, kernel_name="acc-test-venv")
    env = clean_env(tmp_path, ACC_OUTPUT_DIR="", **jupyter)
    env.pop("PYTEST_CURRENT_TEST", None)  # under pytest ipykernel would never capture descriptors
    seen: dict[str, object] = {}

    async def run() -> None:
        try:
            await execute_cells()
        finally:  # the client does not stop a kernel manager it was given
            if km.has_kernel:
                await km.shutdown_kernel(now=True)

    async def execute_cells() -> None:
        async with client.async_setup_kernel(env=env, cwd=str(tmp_path)):
            for index, cell in enumerate(nb.cells):
                task = asyncio.ensure_future(client.async_execute_cell(cell, index))
                if "the test interrupts the kernel here" in cell.source:
                    assert await _pids_written(out, task), \
                        f"the long launch never started: {[c.outputs for c in nb.cells[:index + 1]]}"
                    seen["workers"] = [int((out / f"pid{r}").read_text()) for r in (0, 1)]
                    await asyncio.sleep(0.5)  # on purpose: the workers loop a while before the interrupt
                    seen["interrupted_at"] = time.monotonic()
                    await km.interrupt_kernel()
                await task
                if "the test interrupts the kernel here" in cell.source:
                    seen["cell_ended_after"] = time.monotonic() - seen["interrupted_at"]
                    seen["states_after_interrupt"] = [_state(pid) for pid in seen["workers"]]
                    seen["kernel_pid"] = km.provisioner.pid

    asyncio.run(run())
    setup, train, fails, long_cell, again, kids = nb.cells

    assert _error(setup) is None, setup.outputs
    # 1. trained on 2 ddp processes; the gathered metric saw every evaluation sample once; acc.toml applied
    metric = _line(train, "metric")
    assert metric["world"] == 2 and metric["backend"] == "ddp" and metric["evaluated"] == 83
    assert metric["accuracy"] > 0.85
    assert metric["timeout"] == [321.0, f"project file {tmp_path / 'acc.toml'}"]
    assert "rank 0 trained" in _outputs(train, "stdout") and "rank 1 trained" not in _outputs(train, "stdout")
    # 2. a worker's exception is raised in the cell, with the worker's own traceback (the cell's source line)
    error = _error(fails)
    assert error is not None and error.ename == "WorkerFailedError", fails.outputs
    assert "rank 1 (local rank 1), first failure: exit code 1" in error.evalue
    assert 'raise ValueError("bad batch on rank 1")' in error.evalue  # the line of the cell, from the worker
    assert "ValueError: bad batch on rank 1" in error.evalue
    # 3. the interrupt stopped the launch: KeyboardInterrupt in the cell, no worker left (not even a zombie)
    error = _error(long_cell)
    assert error is not None and error.ename == "KeyboardInterrupt", long_cell.outputs
    assert seen["cell_ended_after"] < 30
    assert seen["states_after_interrupt"] == [None, None], seen
    # 4. the same kernel launches again, on fsdp this time
    assert _error(again) is None, again.outputs
    relaunched = _line(again, "again")
    assert relaunched["world"] == 2 and relaunched["backend"] == "fsdp" and relaunched["evaluated"] == 83
    # 5. the kernel has no child process left (workers, zombies, helpers)
    assert _line(kids, "children") == []
    deadline = time.monotonic() + 20
    while _state(seen["kernel_pid"]) is not None and time.monotonic() < deadline:
        time.sleep(0.1)  # a poll: the kernel manager reaping the kernel has no event to wait on
    assert _state(seen["kernel_pid"]) is None  # the kernel itself is shut down and reaped
