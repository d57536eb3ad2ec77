"""A build lock left by a process killed while DeepSpeed built its op is removed before DeepSpeed starts (it would
wait on it forever): at once where an acc process died holding it (real processes, the kernel's flock), after
STALE_AFTER otherwise; a live acc process loading the op is waited for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from acc_deepspeed.ops_lock import building, clear_stale_locks
from tests.waiting import wait_for_paths


def lock_for() -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory("deepspeed_shm_comm", verbose=False)) / "lock"


def test_a_lock_older_than_any_build_is_removed_and_said(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = lock_for()
    lock.touch()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match=r"removed .*deepspeed_shm_comm/lock.*left 60 min ago"):
        assert clear_stale_locks() == [lock]
    assert not lock.exists() and str(lock).startswith(str(tmp_path))


def test_a_recent_lock_is_kept_and_the_wait_is_said(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = lock_for()
    lock.touch()
    assert clear_stale_locks() == []
    assert lock.exists()
    assert "waiting for DeepSpeed's build of deepspeed_shm_comm" in capsys.readouterr().err
    lock.unlink()
    assert clear_stale_locks() == []  # no lock: nothing to do, nothing said
    assert capsys.readouterr().err == ""


def _in_child(tmp_path, body: str) -> subprocess.Popen:
    """A real process that runs `body` (with `building`, `lock` and `marks` defined), its extensions under tmp_path."""
    code = ("import os, sys, time\nfrom pathlib import Path\nfrom acc_deepspeed.ops_lock import building\n"
            "from torch.utils.cpp_extension import _get_build_directory\n"
            "lock = Path(_get_build_directory('deepspeed_shm_comm', verbose=False)) / 'lock'\n"
            f"marks = Path({str(tmp_path)!r})\n" + body)
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)})


def test_a_lock_left_by_an_acc_process_killed_holding_it_is_removed_at_once(tmp_path, monkeypatch):
    # the kernel releases the dead process's flock, so the next one knows the torch lock is nobody's, however young
    child = _in_child(tmp_path, "with building():\n    lock.touch()\n    os.kill(os.getpid(), 9)\n")
    assert child.wait(timeout=60) == -signal.SIGKILL
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = lock_for()
    assert lock.exists()
    with pytest.warns(UserWarning, match=r"removed .*lock: a build lock .* taken \d+ s ago by an acc process"):
        with building() as removed:
            assert removed == [lock] and not lock.exists()


def test_a_live_acc_process_loading_the_op_is_waited_for(tmp_path, monkeypatch):
    # the child holds the lock 1.5 s on purpose: the time this process must wait for it
    child = _in_child(tmp_path, "with building():\n    lock.touch()\n    (marks / 'in').touch()\n    time.sleep(1.5)\n"
                                "    lock.unlink()\n    (marks / 'out').touch()\n")
    try:
        assert wait_for_paths([tmp_path / "in"], timeout=60, ended=[child]), child.poll()
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing removed, nothing said
            with building() as removed:
                assert (tmp_path / "out").exists() and removed == [] and not lock_for().exists()
    finally:
        assert child.wait(timeout=60) == 0
