"""The launcher under failure (real 2-process ddp runs): reports, exit codes, signals, ports, restarts, logs,
and `acc check`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ACC, ROOT, WORKERS, clean_env, read_rank_results, run
from tests.waiting import is_pid, read_until, wait_for_text

pytestmark = pytest.mark.slow
DDP2 = ["--backend", "ddp", "--nproc", "2"]


def processes_mentioning(token: str) -> list[int]:
    """PIDs (other than this test's) whose command line contains `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if token in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def misbehave(tmp_path: Path, mode: str, *extra: str, launch: list[str] = DDP2, **popen) -> subprocess.Popen:
    out = tmp_path / f"out-{mode}"
    return subprocess.Popen([ACC, "launch", *launch, str(WORKERS / "misbehave.py"), "--mode", mode, "--out", str(out),
                             *extra], cwd=tmp_path, env=clean_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def test_a_rank_that_raises_is_reported_with_its_traceback_and_nothing_is_left(tmp_path):
    proc = misbehave(tmp_path, "raise")
    out, err = proc.communicate(timeout=120)
    ended = time.time()
    raised = float((tmp_path / "out-raise" / "misbehaved_at").read_text())
    assert proc.returncode == 1
    assert ended - raised < 15, f"launcher took {ended - raised:.1f} s to exit after the error"
    report = err[err.index("acc launch: the run failed"):]
    assert "rank 1 (local rank 1), first failure: exit code 1" in report
    assert "ValueError: boom" in report and 'raise ValueError("boom")' in report  # the worker's own traceback
    assert processes_mentioning(str(tmp_path / "out-raise")) == []


def test_a_killed_rank_is_named_with_its_signal_and_log_tail(tmp_path):
    proc = misbehave(tmp_path, "sigkill")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL
    assert "rank 1 (local rank 1), first failure: killed by signal SIGKILL" in err
    assert "rank 1 step 3" in err  # the tail of rank 1's own output, which the console did not show
    assert "rank 1 step" not in out  # by default the console shows the main process only


def test_sigint_to_the_launcher_stops_every_worker(tmp_path):
    proc = misbehave(tmp_path, "run", "--steps", "100000", start_new_session=True)
    pids = tmp_path / "out-run"
    if not wait_for_text([pids / "pid0", pids / "pid1"], timeout=60, ended=[proc], complete=is_pid):
        proc.kill()
        pytest.fail(f"the workers never wrote their pids: {proc.communicate()}")
    workers = [int((pids / f"pid{r}").read_text()) for r in (0, 1)]
    # mid-run: rank 0 printing step 1 means both ranks finished step 0's all-reduce
    seen = read_until(proc.stdout, "rank 0 step 1", timeout=60)
    assert "rank 0 step 1" in seen, seen
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 128 + signal.SIGINT
    assert "stopped by SIGINT" in err
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    assert processes_mentioning(str(pids)) == []


def test_a_taken_port_is_a_clear_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = run([ACC, "launch", *DDP2, "--main-process-port", str(port), str(WORKERS / "misbehave.py"), "--mode",
                    "run", "--steps", "1", "--out", str(tmp_path / "o")], tmp_path)
    assert proc.returncode == 2
    assert f"port {port} (from flag --main-process-port) is already in use on this machine" in proc.stderr


def test_a_collective_timeout_names_the_stuck_rank_and_where_it_was(tmp_path):
    proc = misbehave(tmp_path, "hang", launch=[*DDP2, "--timeout", "3"])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "a collective timed out on rank(s) 0; rank(s) 1 never reached it" in err
    assert "rank 1 was here when it was stopped" in err and "misbehave.py" in err.split("was here")[1]


def test_restart_resumes_from_the_newest_checkpoint(tmp_path):
    proc = run([ACC, "launch", *DDP2, "--max-restarts", "1", str(WORKERS / "restartable.py"), "--project",
                str(tmp_path / "proj"), "--steps", "6", "--fail-at", "4"], tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("attempt")]
    assert lines[0] == "attempt 0 starts at step 0" and lines[-1] == "attempt 1 starts at step 4", lines
    assert "finished 6 steps" in proc.stdout


def test_tee_and_log_dir(tmp_path):
    proc = run([ACC, "launch", *DDP2, "--tee", "--log-dir", str(tmp_path / "logs"), str(WORKERS / "misbehave.py"),
                "--mode", "run", "--steps", "2", "--out", str(tmp_path / "o")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[rank1] rank 1 step 1" in proc.stdout and "[rank0] rank 0 step 1" in proc.stdout
    logs = {p.parent.name: p.read_text() for p in (tmp_path / "logs").rglob("stdout.log")}
    assert "rank 1 step 1" in logs["1"] and "rank 0 step 1" in logs["0"]
    # get_logger logs once unless asked otherwise
    everything = proc.stdout + proc.stderr
    assert everything.count("logger line from rank") == 1 and "logger line from rank 0" in everything
    assert "[rank 1] every rank logs this, rank 1" in everything


def test_acc_check_passes_on_a_healthy_install(tmp_path):
    proc = run([ACC, "check", *DDP2], tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS") == 8 and "FAIL" not in proc.stdout


def test_acc_check_fails_the_matching_check_on_a_broken_backend(tmp_path):
    env = clean_env(tmp_path, PYTHONPATH=str(ROOT / "tests" / "fixtures"))
    proc = run([ACC, "check", *DDP2, "-p", "broken_reduce"], tmp_path, env=env, timeout=180)
    assert proc.returncode == 1
    line = next(ln for ln in proc.stdout.splitlines() if "metric gathering" in ln)
    assert line.strip().startswith("FAIL")
    assert "PASS  processes started" in proc.stdout


@pytest.mark.parametrize("backend", ["ddp", "fsdp", "deepspeed"])
def test_init_process_group_kwargs_timeout_reaches_every_backend(tmp_path, backend):
    """InitProcessGroupKwargs(timeout=timedelta(seconds=77)), Accelerate's spelling, sets the process group's
    timeout (and the run's `timeout` setting, which bounds every collective) on each torch.distributed backend."""
    proc = run([ACC, "launch", "--backend", backend, "--nproc", "2", str(WORKERS / "pg_timeout.py"), "--out",
                str(tmp_path / "o"), "--seconds", "77"], tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for record in read_rank_results(tmp_path / "o").values():
        assert record["group_timeout"] == 77.0 and record["setting"] == 77.0
        assert record["source"] == "code InitProcessGroupKwargs(timeout=...)"
