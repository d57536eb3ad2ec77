"""Checkpoints across real launches on 2 ddp processes: exact resume, a kill during save, total_limit."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ACC, WORKERS, clean_env, read_rank_results
from tests.plugins.ddp.test_ddp import ACC_SEMANTICS, DDP2, acc_launch
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def test_resume_in_a_new_launch_is_bitwise_identical(tmp_path):
    """acc's exact resume (--semantics acc: resume_data_position): the data continue with the next batch."""
    exact = [*DDP2, *ACC_SEMANTICS]
    acc_launch(tmp_path, exact, "resume.py", ["--out", str(tmp_path / "straight"), "--steps", "12"])
    acc_launch(tmp_path, exact, "resume.py", ["--out", str(tmp_path / "a"), "--steps", "5",
                                              "--save", str(tmp_path / "ckpt")])
    acc_launch(tmp_path, exact, "resume.py", ["--out", str(tmp_path / "b"), "--steps", "7",
                                              "--load", str(tmp_path / "ckpt")])
    straight, a, b = (read_rank_results(tmp_path / n) for n in ("straight", "a", "b"))
    for rank in (0, 1):
        assert straight[rank]["weights"] == b[rank]["weights"]
        assert straight[rank]["adam"] == b[rank]["adam"]
        assert straight[rank]["seen"] == a[rank]["seen"] + b[rank]["seen"]  # data order continues exactly
        assert straight[rank]["rand"] == b[rank]["rand"]  # each rank's random stream too
        assert straight[rank]["lr"] == b[rank]["lr"] and b[rank]["count"] == 12 and b[rank]["step"] == 12
    files = set((tmp_path / "ckpt").iterdir())
    assert {p.name for p in files} >= {"rng_state_0.pt", "rng_state_1.pt", "manifest.json", "model_0.safetensors"}


def _wait_for(predicate, proc: subprocess.Popen, *directories: Path, timeout: float = 120) -> None:
    """Until `predicate` holds, checked again at each change in `directories` (no polling): TimeoutError if the
    timeout passes or the run ends first."""
    if not wait_until(predicate, timeout, changes_in=directories, ended=[proc]):
        raise TimeoutError(f"not within {timeout} s" if proc.poll() is None else f"the run ended ({proc.returncode})")


def test_a_worker_killed_during_save_leaves_the_previous_checkpoint(tmp_path):
    project = tmp_path / "proj"
    checkpoints = project / "checkpoints"
    proc = subprocess.Popen(
        [ACC, "launch", *DDP2, str(WORKERS / "resume.py"), "--out", str(tmp_path / "killed"), "--steps", "4",
         "--auto", str(project), "--save-every", "1", "--big-mb", "200", "--pid-file", str(tmp_path / "pid")],
        cwd=tmp_path, env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (checkpoints / "checkpoint_0" / "manifest.json").exists(), proc, checkpoints,
                  checkpoints / "checkpoint_0")
        _wait_for(lambda: any(p.name.startswith(".checkpoint_1.tmp-") for p in checkpoints.iterdir()), proc,
                  checkpoints)
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)  # the main process, mid-save
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    names = {p.name for p in checkpoints.iterdir()}
    assert "checkpoint_0" in names and "checkpoint_1" not in names
    assert any(n.startswith(".checkpoint_1.tmp-") for n in names)  # the incomplete one stays hidden
    acc_launch(tmp_path, DDP2, "resume.py", ["--out", str(tmp_path / "resumed"), "--steps", "1", "--auto",
                                             str(project), "--load", "auto"])
    resumed = read_rank_results(tmp_path / "resumed")
    assert resumed[0]["count"] == 2 and resumed[0]["step"] == 2  # loaded checkpoint_0 (after step 1), ran 1 more


def test_total_limit_keeps_the_two_newest(tmp_path):
    project = tmp_path / "proj"
    acc_launch(tmp_path, DDP2, "resume.py", ["--out", str(tmp_path / "o"), "--steps", "5", "--auto", str(project),
                                             "--save-every", "1", "--total-limit", "2"])
    names = sorted(p.name for p in (project / "checkpoints").iterdir())
    assert names == ["checkpoint_3", "checkpoint_4"]


def test_launch_records_a_run_manifest(tmp_path):
    acc_launch(tmp_path, [*DDP2, "--output-dir", str(tmp_path / "runs")], "resume.py",
               ["--out", str(tmp_path / "o"), "--steps", "1", "--save", str(tmp_path / "ckpt")])
    (run_dir,) = list((tmp_path / "runs").iterdir())
    import json

    launch = json.loads((run_dir / "manifest.json").read_text())
    assert launch["backend"] == "ddp" and launch["processes"]["world_size"] == 2
    assert launch["command"][:4] == ["acc", "launch", "--backend", "ddp"]
    assert launch["settings"]["sources"]["nproc"] == "flag --nproc" and "acc-ddp" in launch["versions"]
    in_ckpt = json.loads((Path(tmp_path / "ckpt") / "manifest.json").read_text())["run"]
    assert in_ckpt["command"] == launch["command"]
    assert in_ckpt["batch_sizes"] == [{"per_process": 4, "global": 8}]
