"""Workers forked from the launcher behave exactly like spawned ones (issue: fast launch)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ACC, WORKERS, clean_env, read_rank_results, run

pytestmark = pytest.mark.slow
DDP2 = ["--backend", "ddp", "--nproc", "2", "--output-dir", ""]


def default_env(tmp_path, **extra: str) -> dict:
    """A clean environment without ACC_START_METHOD: the default start method is under test even when the
    suite runs with ACC_START_METHOD=spawn (to time it)."""
    env = clean_env(tmp_path, **extra)
    env.pop("ACC_START_METHOD", None)
    return env


def facts(tmp_path, method: str) -> dict:
    out = tmp_path / method
    out.mkdir()
    script = WORKERS / "mainscript" / "main_like.py"
    env = clean_env(tmp_path, ACC_DEBUG="1")
    env.pop("OMP_NUM_THREADS", None)  # the launcher's torch starts with one thread per core; workers get their share
    proc = run([ACC, "launch", *DDP2, "--start-method", method, str(script), "--out", str(out), "--flag", "x y"],
               tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"start method {method}" in proc.stderr
    return read_rank_results(out)


def test_a_script_behaves_the_same_forked_and_spawned(tmp_path):
    forked, spawned = facts(tmp_path, "fork"), facts(tmp_path, "spawn")
    script = str(WORKERS / "mainscript" / "main_like.py")
    for rank in (0, 1):
        for key in ("name", "file", "sibling", "path0", "world", "main_module", "threads", "omp"):
            assert forked[rank][key] == spawned[rank][key], key
        assert forked[rank]["argv"][1:3] == ["--out", str(tmp_path / "fork")]
        assert spawned[rank]["argv"][1:3] == ["--out", str(tmp_path / "spawn")]
        assert forked[rank]["name"] == "__main__" and forked[rank]["file"] == script
        assert forked[rank]["sibling"] == "sibling module imported"
        assert forked[rank]["argv"][0] == spawned[rank]["argv"][0] == script
        assert forked[rank]["argv"][-2:] == ["--flag", "x y"]
        assert forked[rank]["threads"] == int(forked[rank]["omp"])  # not the launcher's count: no oversubscription


def test_a_module_runs_forked_with_dash_m(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    env = default_env(tmp_path, ACC_DEBUG="1", PYTHONPATH=str(WORKERS.parents[1]) + ":" + str(WORKERS / "mainscript"))
    proc = run([ACC, "launch", *DDP2, "-m", "tests.workers.mainscript.main_like", "--out", str(out)], tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "start method fork" in proc.stderr
    res = read_rank_results(out)
    assert res[0]["name"] == "__main__" and res[1]["world"] == 2


def report(tmp_path, method: str, mode: str = "raise") -> tuple[int, list[str]]:
    out = tmp_path / f"{method}-{mode}"
    proc = run([ACC, "launch", *DDP2, "--start-method", method, str(WORKERS / "misbehave.py"), "--mode", mode,
                "--out", str(out)], tmp_path)
    text = proc.stderr[proc.stderr.index("acc launch: the run failed"):]
    lines = [re.sub(r"\[127\.0\.0\.1\]:\d+", "[...]", ln) for ln in text.splitlines()
             if ln.startswith("  rank") or "ValueError" in ln or "misbehave.py" in ln]
    return proc.returncode, lines


@pytest.mark.parametrize("mode", ["raise", "sigkill"])
def test_a_rank_failure_is_reported_the_same_forked_and_spawned(tmp_path, mode):
    fork_code, fork_lines = report(tmp_path, "fork", mode)
    spawn_code, spawn_lines = report(tmp_path, "spawn", mode)
    assert fork_code == spawn_code != 0
    assert fork_lines[0] == spawn_lines[0]  # the first failure: same rank, same exit code or signal
    assert "rank 1 (local rank 1), first failure" in fork_lines[0]
    if mode == "raise":
        assert [ln for ln in fork_lines if "ValueError: boom" in ln] and [ln for ln in spawn_lines if "ValueError" in ln]
        assert any('raise ValueError("boom")' in ln for ln in fork_lines)


def test_dry_run_says_how_workers_start(tmp_path):
    proc = run([ACC, "launch", *DDP2, "--dry-run", str(WORKERS / "misbehave.py")], tmp_path, env=default_env(tmp_path))
    assert "start       fork from a launcher that imports torch once (auto: falls back to spawn" in proc.stdout
    proc = run([ACC, "launch", *DDP2, "--start-method", "spawn", "--dry-run", str(WORKERS / "misbehave.py")], tmp_path)
    assert "start       spawn (fresh interpreters)" in proc.stdout
    restarts = run([ACC, "launch", *DDP2, "--max-restarts", "1", str(WORKERS / "mainscript" / "main_like.py"), "--out",
                    str(tmp_path)], tmp_path, env=default_env(tmp_path, ACC_DEBUG="1"))
    assert "start method spawn (restarts are asked for" in restarts.stderr
