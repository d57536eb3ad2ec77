"""acc's backend conformance suite (collected by the `acc.testing` plugin when a backend is named)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from acc import HOOKSPEC_VERSION
from acc.errors import ValidationError
from acc.testing import clean_environment

pytestmark = pytest.mark.acc_conformance
HOOKS_CHECKED = ("acc_setup", "acc_wrap", "acc_wrap_dataloader", "acc_unwrap_model", "acc_no_sync", "acc_backward",
                 "acc_clip_grad_norm", "acc_optimizer_step", "acc_all_gather", "acc_gather_object", "acc_all_reduce",
                 "acc_broadcast", "acc_broadcast_object", "acc_barrier", "acc_save_checkpoint", "acc_load_checkpoint",
                 "acc_model_state_dict")


def _plan(backend: str, nproc: int) -> Any:
    from acc.assembly import assemble
    from acc.launch import orchestrate

    return orchestrate.make_plan(assemble(flags={"backend": backend, "nproc": str(nproc)}))


def _refusal(backend: str, nproc: int) -> str | None:
    """Why the backend refuses `nproc` processes (None when it accepts them)."""
    try:
        _plan(backend, nproc)
    except ValidationError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def job(acc_backend: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`job(nproc)`: the per-rank results of acc.testing.job run on `nproc` real processes (run once each)."""
    cache: dict[int, dict[int, dict]] = {}

    def results(nproc: int) -> dict[int, dict]:
        if nproc not in cache:
            refusal = _refusal(acc_backend, nproc)
            if refusal:
                pytest.skip(f"backend '{acc_backend}' refuses {nproc} processes here: {refusal}")
            out = tmp_path_factory.mktemp(f"job{nproc}")
            cmd = [sys.executable, "-m", "acc", "launch", "--backend", acc_backend, "--nproc", str(nproc),
                   "--output-dir", "", "-m", "acc.testing.job", "--out", str(out)]
            proc = subprocess.run(cmd, cwd=out, env=clean_environment(), capture_output=True, text=True, timeout=900)
            found = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
            assert proc.returncode == 0 and len(found) == nproc, (
                f"the conformance job failed on {nproc} process(es) (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
            cache[nproc] = found
        return cache[nproc]

    return results


def test_loads_through_its_entry_point(acc_backend: str) -> None:
    from acc.plugins import build_plugin_manager, installed_backends

    assert acc_backend in installed_backends(), f"no entry point '{acc_backend}' in the group acc.backends"
    pm, infos = build_plugin_manager(acc_backend)
    assert getattr(pm.get_plugin(acc_backend), "ACC_HOOKSPEC_VERSION", None) == HOOKSPEC_VERSION


@pytest.mark.parametrize("nproc", [1, 2])
def test_launch_plan_is_well_formed(acc_backend: str, nproc: int) -> None:
    refusal = _refusal(acc_backend, nproc)
    if refusal and nproc > 1:
        pytest.skip(f"single-process backend: {refusal}")
    plan = _plan(acc_backend, nproc)
    assert plan.problems() == [] and plan.world_size == nproc and plan.device


def test_dry_run_does_not_import_torch(acc_backend: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    code = ("import sys\nfrom acc.cli import main\n"
            f"try:\n    main(['launch', '--backend', {acc_backend!r}, '--dry-run', {str(script)!r}])\n"
            "except SystemExit as exc:\n    print('EXIT', exc.code)\nprint('TORCH', 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_environment(),
                          cwd=tmp_path, timeout=120)
    assert "EXIT 0" in proc.stdout, proc.stdout + proc.stderr
    assert "TORCH False" in proc.stdout, "the launcher-side hooks import torch (keep it inside worker hooks)"


def test_validate_rejects_a_bad_combination(acc_backend: str, acc_invalid_flags: dict) -> None:
    from acc.assembly import assemble
    from acc.launch import orchestrate

    with pytest.raises(ValidationError):
        orchestrate.make_plan(assemble(flags={"backend": acc_backend, **{k: str(v) for k, v in acc_invalid_flags.items()}}))


@pytest.mark.parametrize("nproc", [1, 2])
def test_selection_hooks_answer_with_the_right_types(job: Any, nproc: int) -> None:
    for rank, result in job(nproc).items():
        bad = {name: result["types"].get(name, {"ok": False, "error": "not reached"}) for name in HOOKS_CHECKED
               if not result["types"].get(name, {}).get("ok")}
        assert not bad, f"rank {rank}: " + "; ".join(f"{k}: {v.get('error', 'wrong type')}" for k, v in bad.items())


@pytest.mark.parametrize("nproc", [1, 2])
def test_training_round_trip(job: Any, nproc: int) -> None:
    results = job(nproc)
    losses = [r["losses"] for r in results.values()]
    assert all(l == losses[0] for l in losses) and all(math.isfinite(x) for x in losses[0])
    for rank, r in results.items():
        assert r["seen"] == list(range(50)), f"rank {rank}: gather_for_metrics returned {len(r['seen'])} samples"
        assert r["round_trip"]["before"] == r["round_trip"]["after"], f"rank {rank}: load_state did not restore"


@pytest.mark.parametrize("nproc", [1, 2])
def test_collectives_agree_with_the_reference(job: Any, nproc: int) -> None:
    for rank, r in job(nproc).items():
        c = r["collectives"]
        assert c["gather"] == [float(i) for i in range(nproc) for _ in range(2)]
        assert c["gather_object"] == [{"rank": i} for i in range(nproc)]
        assert c["reduce_sum"] == [float(sum(range(1, nproc + 1)))] and c["reduce_max"] == [float(nproc)]
        assert c["broadcast"] == [float(nproc - 1)] and c["broadcast_object"] == "from 0"
