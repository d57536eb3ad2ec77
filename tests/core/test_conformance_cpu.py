"""The builtin cpu backend passes acc's own conformance suite (2-process parts skip: it is single-process)."""

import pytest

from tests.conftest import assert_conformance_passed, run_conformance

pytestmark = pytest.mark.slow


def test_cpu_passes_the_conformance_suite(tmp_path):
    proc = run_conformance("cpu", tmp_path, invalid_flags={"nproc": 2})
    assert_conformance_passed(proc, allowed_skips=(
        "single-process backend", "refuses 2 processes", "one-process backend has", "sync none: only a backend",
        "one process only", "declares no data-parallel mesh dimension"))
    assert "single-process backend" in proc.stdout and "refuses 2 processes" in proc.stdout
