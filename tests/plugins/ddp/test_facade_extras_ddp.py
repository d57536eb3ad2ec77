"""Accelerate's less common Accelerator members, on 2 real ddp processes (tests/workers/facade_extras.py):
check_trigger, trigger_sync_in_backward, join_uneven_inputs, profile, pickling, verify_device_map, free_memory."""

from __future__ import annotations

import pytest

from tests.conftest import read_rank_results
from tests.plugins.ddp.test_ddp import DDP2, acc_launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("extras")
    acc_launch(tmp, DDP2, "facade_extras.py", ["--out", str(tmp / "out")], timeout=300)
    got = read_rank_results(tmp / "out")
    assert sorted(got) == [0, 1]
    return got


def test_a_trigger_set_on_one_process_is_seen_once_by_every_process(ranks):
    for rank in (0, 1):
        assert ranks[rank]["triggers"] == [False, False, True, False], rank


def test_no_sync_keeps_gradients_local_and_trigger_sync_in_backward_forces_the_sync(ranks):
    local = ranks[0]["no_sync_grads"]
    assert local[0] != local[1]  # each process's own batch (inputs 1s and 2s)
    forced = ranks[0]["forced_sync_grads"]
    assert forced[0] == forced[1]
    assert forced[0] == pytest.approx([(a + b) / 2 for a, b in zip(local[0], local[1])], rel=1e-6)


def test_join_uneven_inputs_lets_each_process_run_its_own_number_of_steps(ranks):
    assert (ranks[0]["joined_steps"], ranks[1]["joined_steps"]) == (2, 4)


def test_profile_writes_a_trace_per_process(ranks):
    assert all(ranks[r]["trace"] and ranks[r]["profiled_events"] for r in (0, 1))


def test_pickling_refers_to_the_live_accelerator_and_free_memory_drops_everything(ranks):
    for rank in (0, 1):
        r = ranks[rank]
        assert r["pickled_is_same"] and r["verify_device_map"] is False
        assert r["released"] and r["after_free"] == [0, 0, 0, 0]
