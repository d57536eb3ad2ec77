"""A custom tracker written for Accelerate (tests/differential/scripts/tracking.py) receives the same calls on acc
as on Hugging Face Accelerate 1.15, on 1 and 2 processes: start, the config once, every log with its step and
log_kwargs, finish, on the main process only; `trackers` and `get_tracker` answer the same on every rank."""

from __future__ import annotations

import pytest

from tests.differential.harness import compare, migrated, start_acc, start_accelerate, together

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("mode", ["object", "none", "all"])
def test_a_custom_tracker_gets_the_same_calls(mode, nproc, accelerate_python, migrated_dir, tmp_path):
    args = ["--mode", mode]
    script = migrated("tracking.py", migrated_dir)
    reference, got = together(
        lambda: start_accelerate(accelerate_python, "tracking.py", args, nproc, tmp_path / "accelerate", tmp_path),
        lambda: start_acc(script, args, nproc, tmp_path / "acc", tmp_path))
    assert not compare(reference, got), "\n".join(compare(reference, got))
    if mode != "none":
        calls = reference[0]["calls"]
        assert [c[0] for c in calls] == ["start", "config", "log", "log", "log", "log", "finish"], calls
        assert all(r["calls"] == [] for rank, r in reference.items() if rank > 0)
