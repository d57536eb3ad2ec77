"""The chaos soak at CI size: workers of a 2-process run SIGKILLed at random, inside save_state and inside
load_state; the restarted run ends bitwise where an uninterrupted run ends (see tests/integration/chaos.py;
bench/soak.py runs the long version)."""

from __future__ import annotations

import os

import pytest

from tests.integration.chaos import chaos_run

pytestmark = pytest.mark.slow
SEED = int(os.environ.get("ACC_CHAOS_SEED", "24"))


@pytest.mark.parametrize("backend,script", [("ddp", ("--workers", "2")), ("fsdp", ())], ids=["ddp-loader-workers",
                                                                                              "fsdp"])
def test_killed_workers_resume_bitwise_and_train_every_sample_once(tmp_path, backend, script):
    """ddp with 2 DataLoader worker processes per rank (their samplers skip to the resumed batch; they die with
    their killed rank), fsdp with none."""
    outcome = chaos_run(tmp_path, backend, ["random", "save", "load"], seed=SEED, script=script)
    assert outcome.problems == [], "\n".join(outcome.problems)
    killed = [k for k in outcome.kills if "missed" not in k]
    assert [k["kind"] for k in killed] == ["random", "save", "load"], outcome.kills
    assert all(k["inside"] for k in killed if k["kind"] in ("save", "load")), outcome.kills  # really inside
    assert outcome.attempts == 4 and outcome.steps == 30
    assert outcome.bytes_compared > 0
