"""`notebook_launcher` in the situations a notebook meets: acc's version of Accelerate's
test_utils/scripts/test_notebook.py. It launches by itself; run it with plain Python, not under `acc launch`:

    python PATH/test_notebook.py                                # one process
    ACCELERATE_NUM_PROCESSES=2 python PATH/test_notebook.py     # two (ddp on the CPU)

Checks: a function runs and sees its PartialState; on several processes, the children are not in CUDA's bad-fork
state, the static and c10d rendezvous work, a function that fails on its first attempts succeeds with
`max_restarts` (after exactly that many restarts), and a failing rank stops the run at once (the sleeping rank does not hold it up) with the failing
rank's error; with bitsandbytes installed, importing it before the launch is refused.

acc's documented difference: a failed worker raises acc's `WorkerFailedError` (the failing rank's error and
traceback) where Accelerate lets torch's `ChildFailedError` through.
"""

from __future__ import annotations

import os
import time

import pytest

from acc.launchers import WorkerFailedError, notebook_launcher
from acc.state import PartialState
from acc.utils.imports import is_bnb_available

NUM_PROCESSES = int(os.environ.get("ACCELERATE_NUM_PROCESSES", 1))
require_multi_process = pytest.mark.skipif(NUM_PROCESSES < 2, reason="Need at least 2 processes")


def basic_function() -> None:
    print(f"PartialState:\n{PartialState()}")


def tough_nut_function(marker_dir: str, failures: int) -> None:
    """Fails on process 0 for its first `failures` attempts (each leaves a file in `marker_dir`), then prints its
    state: it needs `failures` restarts. (Accelerate counts down in a multiprocessing queue; acc's restarted
    workers are fresh interpreters that unpickle the arguments, and a queue does not pickle, so a directory
    counts here.)"""
    state = PartialState()
    if state.process_index == 0:
        attempt = len(os.listdir(marker_dir))
        with open(os.path.join(marker_dir, f"attempt-{attempt}"), "w"):
            pass
        if attempt < failures:
            raise RuntimeError("The nut hasn't cracked yet! Try again.")
    print(f"PartialState:\n{state}")


def bipolar_sleep_function(sleep_sec: int) -> None:
    if PartialState().process_index % 2 == 0:
        raise RuntimeError("I'm an even process. I don't like to sleep.")
    time.sleep(sleep_sec)


def assert_clean_cuda_fork_function() -> None:
    """A forked child can still use CUDA: the launcher did not initialise CUDA in the parent first."""
    import torch

    if torch.cuda.is_available():
        assert not torch._C._cuda_isInBadFork(), "the child started in CUDA's bad-fork state"


def test_can_initialize() -> None:
    notebook_launcher(basic_function, (), num_processes=NUM_PROCESSES)


@require_multi_process
def test_clean_cuda_fork() -> None:
    notebook_launcher(assert_clean_cuda_fork_function, (), num_processes=NUM_PROCESSES)


@require_multi_process
def test_static_rdzv_backend() -> None:
    notebook_launcher(basic_function, (), num_processes=NUM_PROCESSES, rdzv_backend="static")


@require_multi_process
def test_c10d_rdzv_backend() -> None:
    notebook_launcher(basic_function, (), num_processes=NUM_PROCESSES, rdzv_backend="c10d")


@require_multi_process
def test_fault_tolerant(max_restarts: int = 3) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as markers:
        notebook_launcher(tough_nut_function, (markers, max_restarts), num_processes=NUM_PROCESSES,
                          max_restarts=max_restarts)
        attempts = len(os.listdir(markers))
    assert attempts == max_restarts + 1, f"the function ran {attempts} times on process 0, not {max_restarts + 1}"


@require_multi_process
def test_monitoring(monitor_interval: float = 0.01, sleep_sec: int = 100) -> None:
    start = time.time()
    with pytest.raises(WorkerFailedError, match="I'm an even process. I don't like to sleep."):
        notebook_launcher(bipolar_sleep_function, (sleep_sec,), num_processes=NUM_PROCESSES,
                          monitor_interval=monitor_interval)
    assert time.time() - start < sleep_sec, "Monitoring did not stop the process in time."


def test_problematic_imports() -> None:
    with pytest.raises(RuntimeError, match="Please keep these imports"):
        import bitsandbytes  # noqa: F401

        notebook_launcher(basic_function, (), num_processes=NUM_PROCESSES)


def main() -> None:
    checks = [("basic notebook can be ran", test_can_initialize)]
    if NUM_PROCESSES > 1:
        checks += [("clean CUDA fork", test_clean_cuda_fork), ("static rendezvous backend", test_static_rdzv_backend),
                   ("c10d rendezvous backend", test_c10d_rdzv_backend), ("fault tolerant", test_fault_tolerant),
                   ("monitoring", test_monitoring)]
    if is_bnb_available():
        checks.append(("problematic imports (bnb)", test_problematic_imports))
    for title, check in checks:
        print(f"Test {title}")
        check()


if __name__ == "__main__":
    main()
