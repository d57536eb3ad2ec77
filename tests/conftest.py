"""Shared fixtures: an isolated environment per test, a fresh plugin manager, real `acc` subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# the fixture backends' own tests run from their own project roots, with `-p acc.testing` (see their pyproject.toml),
# where the integration tests install and run them; the main collection leaves them alone
collect_ignore_glob = ["fixtures/*"]

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ROOT / "tests" / "workers"
ACC = str(Path(sys.executable).parent / "acc")
# kept from the outer environment, so the suite's wall time can be compared: ACC_START_METHOD=spawn ./scripts/test.sh
PASSTHROUGH = {k: os.environ[k] for k in ("ACC_START_METHOD",) if k in os.environ}


# what a scheduler sets (a suite run inside a SLURM job, a pod or under mpirun must not take it for the launch's)
SCHEDULER_PREFIXES = ("SLURM_", "PET_", "OMPI_", "PMI_", "PMIX_", "LSB_", "MPI_LOCAL")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """os.environ without ACC_* variables, launcher or scheduler variables, with a private user config dir."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACC_", "TORCHELASTIC_", *SCHEDULER_PREFIXES))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                         "GROUP_RANK")}
    env["ACC_CONFIG_HOME"] = str(tmp_path / "user-config")
    env.update(PASSTHROUGH)
    env.update(extra)
    return env


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The one gate for GPU tests: a test marked `@pytest.mark.cuda` is skipped, saying why, where torch sees no
    CUDA device (scripts/gpu-check.sh runs them on a GPU machine)."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA device: torch {torch.__version__} sees none "
                                   "(torch.cuda.is_available() is False)")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs in its own cwd, with no ACC_* variables and an empty user config dir."""
    for key in list(os.environ):
        if key.startswith(("ACC_", *SCHEDULER_PREFIXES)) or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                                    "MASTER_PORT"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("ACC_CONFIG_HOME", str(tmp_path / "user-config"))
    for key, value in PASSTHROUGH.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def fresh_pm():
    """A plugin manager with acc's specs and the builtin cpu backend, nothing else."""
    import acc.builtin.cpu
    from acc.assembly.plugins import new_plugin_manager, register

    pm = new_plugin_manager()
    register(pm, acc.builtin.cpu, "cpu")
    return pm


def run(args: list[str], tmp_path: Path, timeout: float = 120, env: dict | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command (e.g. [ACC, 'launch', ...]) in a clean environment; output captured as text."""
    return subprocess.run(args, cwd=cwd or tmp_path, env=env or clean_env(tmp_path), capture_output=True,
                          text=True, timeout=timeout)


def read_rank_results(directory: Path) -> dict[int, dict]:
    """The JSON files `rank<N>.json` a worker script wrote, by rank."""
    out = {}
    for path in sorted(directory.glob("rank*.json")):
        out[int(path.stem[4:])] = json.loads(path.read_text())
    return out


def overlay_venv(tmp_path: Path) -> Path:
    """A new venv that sees this venv's packages (acc-core, torch, ...) and installs into its own
    site-packages: for real `pip install -e` tests that must not change the main venv. Returns its python."""
    import site
    import venv

    target = tmp_path / "overlay"
    venv.create(target, with_pip=False)
    python = target / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages())
    (Path(purelib) / "_acc_parent_venv.pth").write_text(lines)
    return python


def pip_install_editable(python: Path, source: Path, tmp_path: Path) -> None:
    """`pip install -e source` into the overlay venv (no network: no deps, no build isolation)."""
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-e", str(source)],
                          capture_output=True, text=True, timeout=300, env=clean_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_conformance(backend: str, tmp_path: Path, invalid_flags: dict | None = None, extra: tuple = (),
                    conftest_extra: str = "", timeout: float = 900) -> subprocess.CompletedProcess:
    """Run acc's conformance suite (`pytest -p acc.testing --acc-backend NAME`) in a fresh directory."""
    work = tmp_path / f"conformance-{backend}"
    work.mkdir()
    lines = ["import pytest\n", conftest_extra]
    if invalid_flags is not None:
        lines.append(f"\n@pytest.fixture\ndef acc_invalid_flags():\n    return {invalid_flags!r}\n")
    (work / "conftest.py").write_text("".join(lines))
    cmd = [sys.executable, "-m", "pytest", "-p", "acc.testing", "--acc-backend", backend, "-q", "-p",
           "no:cacheprovider", "-rs", *extra]
    return subprocess.run(cmd, cwd=work, env=clean_env(tmp_path), capture_output=True, text=True, timeout=timeout)


def assert_conformance_passed(proc: subprocess.CompletedProcess, allowed_skips: tuple[str, ...] = (),
                              minimum: int = 15) -> None:
    """The kit ran (at least `minimum` tests), nothing failed, and every skip is one of `allowed_skips` (fragments
    of the reasons the kit gives, e.g. "declares no mixed precision mode"): a new skip is a test that stopped
    testing."""
    import re

    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|skipped|failed|error)", summary)}
    assert counts.get("passed", 0) + counts.get("skipped", 0) >= minimum and "failed" not in counts, summary
    reasons = re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", proc.stdout, re.M)
    unexpected = [r for r in reasons if not any(fragment in r for fragment in allowed_skips)]
    assert not unexpected, f"skips not allowed for this backend: {unexpected}\n{summary}"


# -------------------------------------------- processes a test leaves behind, named in the summary (for diagnosis)
_FIRST_SEEN: dict[int, str] = {}  # pid of a child of this pytest process -> the test after which it was first seen


def _children_here() -> dict[int, str]:
    """This process's children (acc.launcher.processes.children): pid -> 'state command line'."""
    from acc.launcher.processes import children, state

    found = {}
    for pid in children(os.getpid()):
        try:
            now = state(pid)
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # it ended meanwhile
            continue
        if now is not None:
            found[pid] = f"{now} {command[:160]}"
    return found


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    if sys.platform.startswith("linux"):
        for pid in _children_here():
            _FIRST_SEEN.setdefault(pid, item.nodeid)


def pytest_terminal_summary(terminalreporter) -> None:
    """Children of pytest still there at the end (running or unreaped), each with the test after which it appeared:
    a test that leaves a process behind upsets the process-table checks of the tests after it."""
    if not sys.platform.startswith("linux"):
        return
    left = _children_here()
    if left:
        terminalreporter.section("processes left behind by tests")
        for pid, what in sorted(left.items()):
            terminalreporter.line(f"pid {pid} ({what}), first seen after {_FIRST_SEEN.get(pid, 'the session start')}")
