"""fsdp_keep_unsharded: how many of the last units stay gathered between forward and backward. `auto` measures the
first training step (activations saved for backward, units' gathered bytes, gradient shards) and keeps as many as
fit under the peak backward reaches later; a count sets it; a forward without gradients reshards them at once. The
choice changes no number of the training (tests/workers/keep_unsharded.py, real processes on gloo)."""

from __future__ import annotations

import pytest

from acc_fsdp.keep_unsharded import choose, parse
from tests.conftest import ACC, ROOT, read_rank_results, run
from tests.plugins.ddp.test_ddp import acc_launch

MB = 1_000_000


def test_auto_keeps_what_fits_under_the_later_backward_peak():
    # the bench model: 8 units of 25 MB on 2 processes, activations 0.7 MB: 4 (the peak measured the same as 1's)
    assert choose(720_000, [25 * MB] * 8, [12.5 * MB] * 8) == 4
    # bf16: units gathered in 12.5 MB, gradient shards in float32 12.5 MB: 7
    assert choose(440_000, [12.5 * MB] * 8, [12.5 * MB] * 8) == 7
    # activations outweighing the gradient shards: the last unit only (backward gathers it at once anyway)
    assert choose(400 * MB, [25 * MB] * 8, [12.5 * MB] * 8) == 1
    # many processes: thin gradient shards, little headroom
    assert choose(0, [25 * MB] * 8, [25 * MB / 64] * 8) == 1
    assert choose(0, [25 * MB] * 2, [25 * MB] * 2) == 2 and choose(0, [], []) == 0


def test_the_setting_takes_auto_or_a_count():
    assert parse("auto") is None and parse("3") == 3 and parse(" AUTO ") is None
    with pytest.raises(ValueError, match="fsdp_keep_unsharded 'some': expected auto, or a number of units"):
        parse("some")
    proc = run([ACC, "launch", "--backend", "fsdp", "--nproc", "2", "--fsdp-keep-unsharded", "half", "--dry-run",
                str(ROOT / "examples" / "quickstart.py")], ROOT)
    assert proc.returncode == 2 and "fsdp_keep_unsharded 'half': expected auto" in proc.stderr, proc.stderr


def launch(tmp_path, name: str, *flags: str, batch: int = 2) -> dict:
    acc_launch(tmp_path, ["--backend", "fsdp", "--nproc", "2", *flags], "keep_unsharded.py",
               ["--out", str(tmp_path / name), "--batch", str(batch)])
    return read_rank_results(tmp_path / name)[0]


@pytest.mark.slow
def test_auto_keeps_four_of_eight_small_units_from_the_second_step_and_trains_the_same(tmp_path):
    auto, one = launch(tmp_path, "auto"), launch(tmp_path, "one", "--fsdp-keep-unsharded", "1")
    assert auto["kept"] == 4 and auto["measured"]["kept"] == 4
    assert auto["after_train"] == [[7], [4, 5, 6, 7], [4, 5, 6, 7], [4, 5, 6, 7]]  # step 1 measures, keeping 1
    assert auto["after_eval"] == [[]] * 4  # evaluation reshards what it gathered
    assert one["kept"] == 1 and one["measured"] is None and one["after_train"] == [[7]] * 4
    assert auto["losses"] == one["losses"]  # bitwise: which units stay gathered changes no number


@pytest.mark.slow
def test_auto_keeps_one_where_activations_outweigh_the_gradient_shards(tmp_path):
    big = launch(tmp_path, "big", batch=4096)
    assert big["measured"]["activations"] > 8 * 4096 * 256 * 4  # each unit's input, at least
    assert big["kept"] == 1 and big["after_train"][1:] == [[7]] * 3


@pytest.mark.slow
def test_a_count_is_kept_from_the_first_step_and_false_keeps_none(tmp_path):
    three = launch(tmp_path, "three", "--fsdp-keep-unsharded", "3")
    assert three["kept"] == 3 and three["after_train"] == [[5, 6, 7]] * 4 and three["measured"] is None
    none = launch(tmp_path, "none", "--no-fsdp-keep-last-unsharded")
    assert none["kept"] == 0 and none["after_train"] == [[]] * 4
