"""The worker_memory setting: with release, workers (forked or spawned) give freed tensors back at once and get
fresh memory in transparent huge pages; keep leaves glibc as it is. Real launches on 2 processes."""

from __future__ import annotations

import json
import sys

import pytest

from acc.launcher import worker_memory
from tests.conftest import ROOT, WORKERS, clean_env, read_rank_results, run
from tests.plugins.ddp.test_ddp import acc_launch

DDP2 = ["--backend", "ddp", "--nproc", "2"]


THP = worker_memory.huge_pages_mode() in ("always", "madvise")  # the kernel offers transparent huge pages
HUGE = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"} if THP else {}


def test_release_sets_both_knobs_and_keeps_what_the_user_set():
    assert worker_memory.environment("keep", {}, "off") == {}
    assert worker_memory.environment("keep", {}) == HUGE  # huge_pages auto, the default
    assert worker_memory.environment("release", {}, "off") == {"MALLOC_MMAP_THRESHOLD_": "65536"}
    if not THP:
        pytest.skip(f"the kernel offers no transparent huge pages (mode {worker_memory.huge_pages_mode()})")
    assert worker_memory.environment("release", {}) == {"MALLOC_MMAP_THRESHOLD_": "65536",
                                                         "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    mine = {"MALLOC_MMAP_THRESHOLD_": "1048576", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert worker_memory.environment("release", mine) == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
    assert worker_memory.environment("release", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) == {
        "MALLOC_MMAP_THRESHOLD_": "65536"}  # the user's own hugetlb choice stands


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_release_returns_freed_tensors_and_uses_huge_pages(tmp_path, start):
    out = tmp_path / "release"
    acc_launch(tmp_path, [*DDP2, "--start-method", start, "--worker-memory", "release"], "worker_memory.py",
               ["--out", str(out)])
    results = read_rank_results(out)
    assert sorted(results) == [0, 1]
    for rank, r in results.items():
        assert r["env"] == {"MALLOC_MMAP_THRESHOLD_": "65536", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, r
        assert r["held_kb"] > 90 * 1024, r  # 96 MiB were touched
        assert r["released_kb"] > 0.9 * r["held_kb"], (rank, r)  # and left the process when freed
        if worker_memory.huge_pages_mode() in ("always", "madvise"):
            assert r["huge_kb"] >= 64 * 1024, (rank, r)  # most of the 128 MiB tensor in 2 MiB pages


@pytest.mark.parametrize("huge", ["auto", "off"])
def test_keep_leaves_the_threshold_alone_and_huge_pages_follow_their_setting(tmp_path, huge):
    out = tmp_path / f"keep-{huge}"
    acc_launch(tmp_path, [*DDP2, "--huge-pages", huge], "worker_memory.py", ["--out", str(out)])
    for r in read_rank_results(out).values():
        tunables = HUGE.get("GLIBC_TUNABLES") if huge == "auto" else None
        assert r["env"] == {"MALLOC_MMAP_THRESHOLD_": None, "GLIBC_TUNABLES": tunables}, r
        if worker_memory.huge_pages_mode() == "madvise":
            if huge == "off":
                assert r["huge_kb"] == 0, r  # nothing asked for huge pages
            else:
                assert r["huge_kb"] >= 64 * 1024, r  # most of the 128 MiB tensor in 2 MiB pages


def test_acc_launch_from_python_forks_workers_that_release_and_says_what_they_miss(tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(WORKERS)!r}); import acc, json, worker_memory; "
            "print(json.dumps(acc.launch(worker_memory.measure, backend='ddp', nproc=2, worker_memory='release', "
            "output_dir='', return_all=True)))")
    env = clean_env(tmp_path)
    env.pop("GLIBC_TUNABLES", None)
    proc = run([sys.executable, "-c", code], tmp_path, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in results:
        assert r["released_kb"] > 0.9 * r["held_kb"], r  # the threshold, set in each forked worker
    assert "get no 2 MiB pages" in proc.stderr and "start_method='spawn'" in proc.stderr
