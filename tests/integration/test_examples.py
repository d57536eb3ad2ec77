"""The examples train for real through `acc launch`: the loss falls."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ACC, ROOT, run

pytestmark = pytest.mark.slow


def losses(output: str) -> list[float]:
    return [float(x) for x in re.findall(r"train loss ([0-9.]+)", output)]


@pytest.mark.parametrize("launch", [[], ["--backend", "ddp", "--nproc", "2"]], ids=["cpu", "ddp2"])
def test_quickstart_trains(tmp_path, launch):
    proc = run([ACC, "launch", *launch, str(ROOT / "examples" / "quickstart.py"), "--epochs", "5"], tmp_path,
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = losses(proc.stdout)
    assert len(found) == 5, proc.stdout  # printed once (main process), one line per epoch
    assert found[-1] < 0.8 * found[0], found
    assert "500 samples" in proc.stdout  # evaluation saw every test sample exactly once
