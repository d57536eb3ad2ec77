"""The reference venv (Accelerate 1.15), built once per machine by scripts/accelerate-venv.sh."""

from __future__ import annotations

import pytest

from tests.differential.harness import build_reference_venv


@pytest.fixture(scope="session")
def accelerate_python():
    return build_reference_venv()


@pytest.fixture(scope="session")
def migrated_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("migrated")
