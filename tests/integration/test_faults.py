"""Checkpoints under faults, on 2 real ddp processes: a file system that fills while saving, a corrupt or incomplete
newest checkpoint. Each test checks the message, the exit code, that nothing is lost (the surviving checkpoint
resumes to the same bits as an uninterrupted run) and that no process is left."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ACC, WORKERS, clean_env
from tests.integration.chaos import leftover_processes

pytestmark = pytest.mark.slow
DDP2 = ["--backend", "ddp", "--nproc", "2", "--resume-data-position"]


def chaos(tmp_path: Path, project: Path, out: Path, *extra: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([ACC, "launch", *DDP2, str(WORKERS / "chaos.py"), "--project", str(project), "--out",
                           str(out), *extra], cwd=tmp_path, env=clean_env(tmp_path), capture_output=True, text=True,
                          timeout=timeout)


def finals(out: Path) -> dict[int, dict]:
    return {r: json.loads((out / f"final{r}.json").read_text()) for r in (0, 1)}


def same_bits(a: dict[int, dict], b: dict[int, dict]) -> None:
    for rank in (0, 1):
        for key in ("weights", "adam", "lr", "steps", "rand"):
            assert a[rank][key] == b[rank][key], (rank, key)


@contextlib.contextmanager
def small_filesystem(path: Path, size: int):
    """A tmpfs of `size` bytes mounted at `path` (None where this sandbox cannot mount: the caller injects)."""
    path.mkdir(parents=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    try:
        yield path if proc.returncode == 0 else None
    finally:
        if proc.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_full_disk_fails_the_save_clearly_and_keeps_the_previous_checkpoint(tmp_path):
    """The second checkpoint does not fit: every process fails with one message naming the directory, the bytes
    needed and free; the first checkpoint stays complete and resumes bitwise; the temporary directory is gone."""
    with small_filesystem(tmp_path / "small", 1536 * 1024) as mounted:
        project = (mounted or tmp_path / "small") / "proj"
        injected = [] if mounted else ["--no-space-at-save", "2"]
        proc = chaos(tmp_path, project, tmp_path / "full", "--steps", "6", "--save-every", "3", "--total-limit", "1",
                     "--big-mb", "1", *injected)
        assert proc.returncode == 1, proc.stderr[-3000:]
        report = proc.stderr[proc.stderr.index("acc launch: the run failed"):]
        checkpoints = project / "checkpoints"
        message = re.search(r"CheckpointError: (\(process \d\) )?save_state: the file system of (\S+) is full: writing "
                            r"(.+?) failed; the checkpoint (\S+) needs about (\d+) bytes \(the size of checkpoint_0\) "
                            r"and (\d+) bytes are free there\. Nothing was published: the previous checkpoint (\S+) is "
                            r"complete and unchanged, and the temporary directory (\S+) was removed", report)
        assert message, report
        assert message.group(2) == str(checkpoints) and message.group(4) == str(checkpoints / "checkpoint_1")
        assert int(message.group(5)) > 1024 * 1024
        if mounted:
            assert int(message.group(6)) < int(message.group(5))  # free < needed
        assert message.group(7) == str(checkpoints / "checkpoint_0")
        assert "Traceback" not in report.split("first failure")[0]
        assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint_0"]  # no partial directory left
        assert leftover_processes(str(tmp_path / "full")) == []
        # nothing lost: checkpoint_0 (after step 3) resumes to the bits of an uninterrupted 3-step run
        resumed = chaos(tmp_path, project, tmp_path / "resumed", "--steps", "3", "--save-every", "100", "--big-mb", "1")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight = chaos(tmp_path, tmp_path / "straight-proj", tmp_path / "straight", "--steps", "3", "--save-every", "100",
                     "--big-mb", "1")
    assert straight.returncode == 0, straight.stderr[-3000:]
    same_bits(finals(tmp_path / "resumed"), finals(tmp_path / "straight"))
    events = [json.loads(ln) for ln in (tmp_path / "resumed" / "events.jsonl").read_text().splitlines()]
    assert {e["checkpoint"] for e in events if e["event"] == "loaded"} == {"checkpoint_0"}


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """An uninterrupted 6-step run (its finals) and the project of a run that saved after steps 3 and 6."""
    work = tmp_path_factory.mktemp("corrupt")
    proc = chaos(work, work / "proj", work / "straight", "--steps", "6", "--save-every", "3", "--total-limit", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work


def _copy_project(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source / "proj", target / "proj")
    return target / "proj" / "checkpoints"


@pytest.mark.parametrize("damage", ["flipped byte", "missing file"])
def test_a_corrupt_newest_checkpoint_is_refused_and_the_previous_one_resumes(tmp_path, two_checkpoints, damage):
    checkpoints = _copy_project(two_checkpoints, tmp_path)
    if damage == "flipped byte":
        bad = checkpoints / "checkpoint_1" / "model_0.safetensors"
        data = bytearray(bad.read_bytes())
        data[len(data) // 2] ^= 0x01
        bad.write_bytes(bytes(data))
        reason = f"{bad}: corrupt: its blake3 checksum differs from the manifest's (found by process 0)"
    else:
        bad = checkpoints / "checkpoint_1" / "rng_state_1.pt"  # read by process 1 only: the choice is collective
        bad.unlink()
        reason = f"{bad}: missing (listed in the manifest) (found by process 1)"
    # the resumed run redoes steps 4-6 from checkpoint_0 and ends with the bits of the uninterrupted run
    proc = chaos(tmp_path, tmp_path / "proj", tmp_path / "resumed", "--steps", "6", "--save-every", "3",
                 "--total-limit", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"load_state: refused {checkpoints / 'checkpoint_1'}: {reason}; loading {checkpoints / 'checkpoint_0'} "
            "instead, the newest complete checkpoint whose files all verify") in " ".join(proc.stderr.split())
    same_bits(finals(tmp_path / "resumed"), finals(two_checkpoints / "straight"))
    events = [json.loads(ln) for ln in (tmp_path / "resumed" / "events.jsonl").read_text().splitlines()]
    assert {e["checkpoint"] for e in events if e["event"] == "loaded"} == {"checkpoint_0"}
    assert leftover_processes(str(tmp_path / "resumed")) == []


def test_a_corrupt_checkpoint_named_explicitly_is_refused_and_nothing_is_loaded(tmp_path, two_checkpoints):
    checkpoints = _copy_project(two_checkpoints, tmp_path)
    bad = checkpoints / "checkpoint_1" / "optimizer_0.pt"
    data = bytearray(bad.read_bytes())
    data[-10] ^= 0xFF
    bad.write_bytes(bytes(data))
    proc = chaos(tmp_path, tmp_path / "other", tmp_path / "explicit", "--steps", "6", "--load",
                 str(checkpoints / "checkpoint_1"))
    assert proc.returncode == 1
    assert (f"CheckpointError: load_state: refused {checkpoints / 'checkpoint_1'}: {bad}: corrupt: its blake3 "
            "checksum differs from the manifest's") in proc.stderr
    events = [json.loads(ln) for ln in (tmp_path / "explicit" / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] in ("loaded", "step")]  # it stopped: nothing loaded, nothing trained
    assert leftover_processes(str(tmp_path / "explicit")) == []


def test_no_checkpoint_verifies_lists_each_and_loads_nothing(tmp_path, two_checkpoints):
    checkpoints = _copy_project(two_checkpoints, tmp_path)
    (checkpoints / "checkpoint_1" / "kernel_state.pt").unlink()
    (checkpoints / "checkpoint_0" / "manifest.json").write_text('{"format": "acc-checkpoint/1", "files": []}')
    proc = chaos(tmp_path, tmp_path / "proj", tmp_path / "none", "--steps", "6")
    assert proc.returncode == 1
    flat = " ".join(proc.stderr.split())
    assert f"load_state: no checkpoint in {checkpoints} verifies, nothing was loaded: checkpoint_1: " in flat
    assert "kernel_state.pt: missing (listed in the manifest)" in flat
    assert "checkpoint_0: " in flat and "'files' must map file names to their size and sha256, got list" in flat
