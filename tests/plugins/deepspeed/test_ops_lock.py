"""A build lock left by a process killed while DeepSpeed built its op is removed before DeepSpeed starts (it would
wait on it forever); a recent one is kept and waited on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from acc_deepspeed.ops_lock import clear_stale_locks


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
