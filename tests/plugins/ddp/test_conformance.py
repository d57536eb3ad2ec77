"""ddp passes acc's conformance suite (run as a plugin author would: pytest -p acc.testing)."""

import pytest

from tests.conftest import assert_conformance_passed, run_conformance

pytestmark = pytest.mark.slow


def test_ddp_passes_the_conformance_suite(tmp_path):
    proc = run_conformance("ddp", tmp_path, invalid_flags={"process_group_backend": "nccl", "cpu": True})
    assert_conformance_passed(proc)
