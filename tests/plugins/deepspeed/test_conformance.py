"""deepspeed passes acc's conformance suite (pytest -p acc.testing), on ZeRO-3 (the hardest stage)."""

import pytest

from tests.conftest import assert_conformance_passed, run_conformance

pytestmark = pytest.mark.slow


def test_deepspeed_passes_the_conformance_suite(tmp_path):
    user = tmp_path / "user-config"  # the user config file every launch of the suite reads (ACC_CONFIG_HOME)
    user.mkdir()
    (user / "config.toml").write_text("[deepspeed]\nzero_stage = 3\n")
    proc = run_conformance("deepspeed", tmp_path, invalid_flags={"zero_stage": 2, "offload_params": "cpu"})
    # acc's deepspeed checkpoints are DeepSpeed's own per-rank ZeRO files: they load on the same world size only
    assert_conformance_passed(proc, allowed_skips=("does not declare resharding",))
