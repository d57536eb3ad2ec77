"""xla runs acc's conformance suite in its lane (one XLA CPU device: the 2-process parts are refused by the
plan, with the reason, and skipped)."""

import pytest

from tests.conftest import assert_conformance_passed, run_conformance
from tests.plugins.xla.conftest import needs_xla

pytestmark = [pytest.mark.slow, needs_xla]


def test_xla_passes_the_conformance_suite(tmp_path):
    proc = run_conformance("xla", tmp_path, invalid_flags={"mixed_precision": "fp16"})
    assert_conformance_passed(proc, allowed_skips=(
        "single-process backend", "refuses 2 processes", "one-process backend has", "sync none: only a backend",
        "one process only", "declares no data-parallel mesh dimension", "declares no mixed precision mode"))
