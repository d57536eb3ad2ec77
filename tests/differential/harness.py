"""Run one Accelerate-style script with Hugging Face Accelerate 1.15 and, with only its imports changed, with acc;
compare what every rank recorded.

The reference side runs in the venv `scripts/accelerate-venv.sh` builds (Accelerate on the main lane's torch;
`cpu=True` in the scripts, 2 processes under torchrun, as Accelerate is run on CPUs). The acc side is the same
file after `acc migrate --write`, started with `acc launch`. Each rank of a script writes OUT/rank<N>.json.
The two runs of a comparison are independent processes (each its own out dir, each launcher its own free port),
so `together` runs them at once and then compares.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ACC, ROOT, clean_env

SCRIPTS = ROOT / "tests" / "differential" / "scripts"
VENV_SCRIPT = ROOT / "scripts" / "accelerate-venv.sh"


def build_reference_venv() -> Path:
    """The reference venv's python (built once, cached under ~/.cache/acc); a failure fails, never skips."""
    proc = subprocess.run([str(VENV_SCRIPT)], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{VENV_SCRIPT} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


# the scripts the tests run migrated: `acc migrate --write` rewrites them in one call (its start costs what
# checking them does), the first time a test asks for one of them
MIGRATED = ("train.py", "collectives.py", "two_models.py", "inference.py", "tracking.py", "checkpoint_interop.py")


def migrated(script: str, workdir: Path) -> Path:
    """A copy of tests/differential/scripts/SCRIPT whose imports `acc migrate --write` changed to acc's."""
    target = workdir / f"acc_{script}"
    if not target.exists():
        batch = [name for name in dict.fromkeys([script, *MIGRATED]) if not (workdir / f"acc_{name}").exists()]
        if _migrate(batch, workdir).returncode != 0:
            # some script uses a name acc lacks: migrate this one alone, so that only its tests fail, saying so
            for name in batch:
                (workdir / f"acc_{name}").unlink(missing_ok=True)
            proc = _migrate([script], workdir)
            if proc.returncode != 0:
                target.unlink()  # the next test of this script fails the same way
            assert proc.returncode == 0, \
                f"acc migrate reports names acc lacks in {script}:\n{proc.stdout}{proc.stderr}"
    assert "from accelerate" not in target.read_text()
    return target


def _migrate(scripts: list[str], workdir: Path) -> subprocess.CompletedProcess:
    """Copy SCRIPTS into workdir as acc_NAME and `acc migrate --write` them (one process)."""
    targets = [workdir / f"acc_{name}" for name in scripts]
    for name, target in zip(scripts, targets):
        shutil.copy(SCRIPTS / name, target)
    return subprocess.run([ACC, "migrate", "--write", *map(str, targets)], capture_output=True, text=True,
                          timeout=120)


# Accelerate 1.15 on torch 2.13's gloo: now and then (1 in ~40 2-process runs here, after the barrier in the
# scripts) a rank aborts in C++ teardown after its record is written; the records are complete, the exit is not ours
_TEARDOWN_ABORT = "terminate called without an active exception"
TIMEOUT = 300


class Run:
    """One started run of a script (its own process, out dir and free rendezvous port, so runs can overlap);
    `records()` waits for it and returns what every rank wrote, or fails saying how the run failed."""

    def __init__(self, cmd: list[str], out: Path, tmp: Path, what: str, nproc: int, reference: bool) -> None:
        # reference: Accelerate's run, whose abort at exit (_TEARDOWN_ABORT) is let pass once every record is written
        self.cmd, self.out, self.what, self.nproc, self.reference = cmd, out, what, nproc, reference
        env = clean_env(tmp, OMP_NUM_THREADS="1", PYTHONPATH=str(SCRIPTS))
        # files, not pipes: a run that is not being read while another is waited for never blocks on its output
        self.stdout, self.stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.deadline = time.monotonic() + TIMEOUT
        # its own session: stopping it stops the launcher's workers too, not the launcher alone
        self.proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=self.stdout, stderr=self.stderr, text=True,
                                     start_new_session=True)

    def records(self) -> dict[int, dict]:
        try:
            self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise subprocess.TimeoutExpired(self.cmd, TIMEOUT, *self._output()) from None
        stdout, stderr = self._output()
        out, nproc, code = self.out, self.nproc, self.proc.returncode
        complete = self.reference and all((out / f"rank{rank}.json").exists() for rank in range(nproc))
        if code != 0 and complete and _TEARDOWN_ABORT in stderr:
            print(f"{self.what}: every rank wrote its record, then a rank aborted at exit ({_TEARDOWN_ABORT!r}); "
                  "comparing the records", file=sys.stderr)
        elif code != 0:
            raise AssertionError(f"{self.what} failed (exit {code}): {' '.join(self.cmd)}\n"
                                 f"{stdout[-2000:]}\n{stderr[-4000:]}")
        return read(out, nproc)

    def _output(self) -> tuple[str, str]:
        texts = []
        for f in (self.stdout, self.stderr):
            f.seek(0)
            texts.append(f.read())
            f.close()
        return texts[0], texts[1]

    def stop(self) -> None:
        """Kill the run if it is still going (as subprocess.run does on a timeout or an interrupt)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def together(*starts: Callable[[], Run]) -> list[dict[int, dict]]:
    """Start every run (in order; each start returns a Run), then wait for them all: their records, in order.
    The runs are independent (each has its own out dir), so they run at once; the first failure in that order
    is raised, and a run still going then is stopped."""
    runs: list[Run] = []
    try:
        for start in starts:
            runs.append(start())
        return [run.records() for run in runs]
    finally:
        for run in runs:
            run.stop()


def start_accelerate(python: Path, script: str, args: list[str], nproc: int, out: Path, tmp: Path) -> Run:
    """The script under Accelerate: plain python on 1 process, torchrun --standalone on several."""
    launch = [str(python)] if nproc == 1 else [str(python), "-m", "torch.distributed.run", "--standalone",
                                               f"--nproc_per_node={nproc}"]
    return Run([*launch, str(SCRIPTS / script), "--out", str(out), *args], out, tmp, "Accelerate's run", nproc, True)


def start_acc(script_path: Path, args: list[str], nproc: int, out: Path, tmp: Path, backend: str = "ddp",
              flags: tuple[str, ...] = ()) -> Run:
    """The migrated script under `acc launch` (the cpu backend on 1 process unless `backend` says otherwise)."""
    launch = [ACC, "launch", "--output-dir", ""]
    if nproc > 1 or backend != "ddp":
        launch += ["--backend", backend, "--nproc", str(nproc)]
    return Run([*launch, *flags, str(script_path), "--out", str(out), *args], out, tmp, "acc's run", nproc, False)


def read(out: Path, nproc: int) -> dict[int, dict]:
    ranks = {}
    for rank in range(nproc):
        path = out / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no {path.name} in {out}"
        ranks[rank] = json.loads(path.read_text())
    return ranks


def _max_diff(a: list, b: list) -> float:
    if len(a) != len(b):
        return math.inf
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def compare(reference: dict[int, dict], got: dict[int, dict], tol: float = 1e-6, lr_tol: float = 1e-12) -> list[str]:
    """Every difference between the two runs' records, as readable lines (empty: they trained identically)."""
    problems: list[str] = []
    for rank in sorted(reference):
        ref, mine = reference[rank], got[rank]
        ref_steps, my_steps = ref.get("steps", []), mine.get("steps", [])
        if len(ref_steps) != len(my_steps):
            problems.append(f"rank {rank}: {len(ref_steps)} steps with Accelerate, {len(my_steps)} with acc")
        for i, (a, b) in enumerate(zip(ref_steps, my_steps)):
            if a["ids"] != b["ids"]:
                problems.append(f"rank {rank} step {i}: samples {a['ids']} with Accelerate, {b['ids']} with acc")
                break
            if abs(a["lr"] - b["lr"]) > lr_tol:
                problems.append(f"rank {rank} step {i}: lr {a['lr']} with Accelerate, {b['lr']} with acc")
                break
            for key in ("sync", "skipped"):
                if a.get(key) != b.get(key):
                    problems.append(f"rank {rank} step {i}: {key} {a.get(key)} with Accelerate, {b.get(key)} with acc")
            for key in ("loss", "norm"):
                x, y = a.get(key), b.get(key)
                if (x is None) != (y is None) or (x is not None and abs(x - y) > tol):
                    problems.append(f"rank {rank} step {i}: {key} {x} with Accelerate, {y} with acc")
        for name, values in ref.get("weights", {}).items():
            diff = _max_diff(values, mine.get("weights", {}).get(name, []))
            if diff > tol:
                problems.append(f"rank {rank}: weight {name} differs by {diff:.3g} (tolerance {tol})")
        for i, (a, b) in enumerate(zip(ref.get("exp_avg", []), mine.get("exp_avg", []))):
            diff = _max_diff(a, b)
            if diff > tol:
                problems.append(f"rank {rank}: optimizer state #{i} differs by {diff:.3g}")
        for key in sorted(set(ref) - {"steps", "weights", "exp_avg"}):
            if ref[key] != mine.get(key):
                problems.append(f"rank {rank}: {key} = {ref[key]!r} with Accelerate, {mine.get(key)!r} with acc")
    return problems
