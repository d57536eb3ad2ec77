"""`acc.testing`: a pytest plugin with a conformance suite any backend (ours or a third party's) can run.

    pytest -p acc.testing --acc-backend NAME        # or, in a conftest.py: pytest_plugins = ["acc.testing"]
                                                    # and `acc_backend = NAME` in pytest.ini / pyproject
With a backend named (option, ini value or ACC_TEST_BACKEND), the suite in `acc.testing.suite` is collected (marker
`acc_conformance`; its test ids can be passed back to pytest). It holds the backend to the promises it declares
in `acc_capabilities`, on 1 and 2 real processes: the plugin loads and plans torch-free, its validate hook rejects
a bad combination (define an `acc_invalid_flags` fixture in the conftest.py at your project's root), hooks answer
with the right types and the collectives with the reference values, every sample is gathered once, replicas agree
at every synchronisation point, a synchronous run equals one process with N times the batch, micro-steps keep
gradients local and communicate nothing, checkpoints give every rank its own state back (at several points, with
Adam) and training continues exactly after load_state, the declared mixed-precision modes run, checkpoints
reshard when declared. Backend settings for its launches: `--acc-flags "--NAME-OPTION VALUE"` (or the `acc_flags`
ini value, or ACC_TEST_FLAGS).

Fixtures for the author's own tests: `acc_backend` (the name), `acc_pm` (a fresh plugin manager with the builtin
cpu backend and this backend), `acc_launch` (run a script or module under N real processes with
`acc launch --backend NAME --nproc N`).

The kit sits below the CLI: it imports the faces (`acc.accelerator`), the assembly and the launcher, never the
CLI; `check_job` is the job `acc check` runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SUITE = Path(__file__).with_name("suite.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("acc", "acc backend conformance")
    group.addoption("--acc-backend", action="store", default=None,
                    help="run acc's conformance suite against this backend (entry-point name)")
    group.addoption("--acc-flags", action="store", default=None,
                    help="backend settings for the suite's launches, e.g. \"--localsgd-sync-every 2\"")
    parser.addini("acc_backend", "backend the acc conformance suite checks", default="")
    parser.addini("acc_flags", "backend settings (acc launch flags) for the conformance suite's launches", default="")


def backend_flags(config: pytest.Config) -> list[str]:
    """The `acc launch` flags the suite adds to every launch (option, ini value or ACC_TEST_FLAGS)."""
    import shlex

    return shlex.split(config.getoption("--acc-flags") or config.getini("acc_flags")
                       or os.environ.get("ACC_TEST_FLAGS", ""))


def backend_name(config: pytest.Config) -> str | None:
    return config.getoption("--acc-backend") or config.getini("acc_backend") or os.environ.get("ACC_TEST_BACKEND") or None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "acc_conformance: a test of acc's backend conformance suite")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """Add the conformance suite to the session when a backend is named (once, even if imported)."""
    if not backend_name(config) or any(getattr(i, "module", None) and Path(i.module.__file__) == SUITE for i in items):
        return
    # node ids start with the suite's absolute path, so `pytest -p acc.testing --acc-backend X PATH::test_id`
    # reruns one test (the suite lies outside the author's rootdir; a relative id would not resolve)
    items.extend(session.genitems(pytest.Module.from_parent(session, path=SUITE, nodeid=str(SUITE))))


@pytest.fixture(scope="session")
def acc_backend(request: pytest.FixtureRequest) -> str:
    name = backend_name(request.config)
    if not name:
        pytest.skip("no backend named: pass --acc-backend NAME (or set acc_backend in the pytest ini file)")
    return name


@pytest.fixture
def acc_pm(acc_backend: str) -> Any:
    """A fresh plugin manager: the builtin cpu backend plus `acc_backend`, loaded through its entry point."""
    from acc.assembly.plugins import build_plugin_manager

    return build_plugin_manager(acc_backend)[0]


@pytest.fixture
def acc_invalid_flags() -> dict[str, Any]:
    """Override in your conftest.py: settings (name -> value) your acc_validate must reject."""
    pytest.skip("define an `acc_invalid_flags` fixture (settings your acc_validate must reject) to check it")


def clean_environment(**extra: str) -> dict[str, str]:
    """os.environ without ACC_* settings and launcher variables (a launch under test is not steered by the
    caller's settings); where config files live (ACC_CONFIG_HOME, ACC_CONFIG_FILE) is kept."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    keep = ("ACC_CONFIG_HOME", "ACC_CONFIG_FILE")
    env = {k: v for k, v in os.environ.items()
           if k in keep or (not k.startswith(("ACC_", "TORCHELASTIC_")) and k not in drop)}
    env.update(extra)
    return env


@pytest.fixture
def acc_launch(acc_backend: str, tmp_path: Path) -> Any:
    """`acc_launch(["-m", "pkg.job", ...], nproc=2)` runs `acc launch --backend NAME --nproc N ...`."""

    def launch(args: list[str], nproc: int = 1, flags: list[str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "acc", "launch", "--backend", acc_backend, "--nproc", str(nproc),
               "--output-dir", "", *(flags or []), *args]
        return subprocess.run(cmd, cwd=tmp_path, env=clean_environment(), capture_output=True, text=True,
                              timeout=timeout)

    return launch
