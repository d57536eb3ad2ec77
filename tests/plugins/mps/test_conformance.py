"""mps runs acc's conformance suite with MPS faked (pytest -p acc.testing). Only the launcher-side parts can run
here: the job and dry-run parts start real processes, which would need a real MPS device (they run on a Mac)."""

import pytest

from tests.conftest import ROOT, assert_conformance_passed, run_conformance

pytestmark = pytest.mark.slow

FAKE = f'''
import sys
sys.path.insert(0, {str(ROOT)!r})
from tests.plugins.mps.conftest import fake_mps  # noqa: F401

@pytest.fixture(autouse=True)
def _mps_everywhere(fake_mps):
    yield
'''


def test_mps_passes_the_launcher_side_of_the_suite_with_mps_faked(tmp_path):
    proc = run_conformance("mps", tmp_path, invalid_flags={"nproc": 2}, conftest_extra=FAKE,
                           extra=("-k", "loads_through or launch_plan or validate"))
    assert_conformance_passed(proc, allowed_skips=("single-process backend", "declares no data-parallel mesh dimension"), minimum=3)
    assert "single-process backend" in proc.stdout  # the 2-process plan is refused, with the reason
