"""fsdp passes acc's conformance suite (pytest -p acc.testing)."""

import pytest

from tests.conftest import assert_conformance_passed, run_conformance

pytestmark = pytest.mark.slow


def test_fsdp_passes_the_conformance_suite(tmp_path):
    proc = run_conformance("fsdp", tmp_path, invalid_flags={"mixed_precision": "fp16"})
    assert_conformance_passed(proc)
