"""`acc launch --backend xla` as a user runs it: the dry run is torch-free and shows the PJRT plan; without
torch_xla the launch stops with the install message. In the main lane acc-xla is installed into an overlay
venv (the main venv never gets it); in the xla lane it is already installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from acc.assembly.plugins import installed_backends
from tests.conftest import ROOT, clean_env, overlay_venv, pip_install_editable
from tests.plugins.xla.conftest import HAVE_XLA

pytestmark = pytest.mark.slow

LOADED = ("torch", "torch_xla", "acc_xla.plugin")


@pytest.fixture(scope="module")
def python_with_acc_xla(tmp_path_factory) -> str:
    """A python whose environment has acc-xla installed (and torch_xla only if this lane has it)."""
    if "xla" in installed_backends():
        return sys.executable
    tmp = tmp_path_factory.mktemp("xla-overlay")
    python = overlay_venv(tmp)
    pip_install_editable(python, ROOT / "plugins" / "xla", tmp)
    return str(python)


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('should not run')\n")
    return path


def acc_cli(python: str, args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "acc", *args], cwd=tmp_path, env=clean_env(tmp_path, **env),
                          capture_output=True, text=True, timeout=120)


def stand_in_torch_xla(tmp_path: Path) -> str:
    """A torch_xla that `find_spec` finds but that fails if anything imports it (for the main lane)."""
    pkg = tmp_path / "stand-in" / "torch_xla"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the launcher must not import torch_xla')\n")
    return str(pkg.parent)


def test_dry_run_shows_the_pjrt_plan_without_importing_torch(python_with_acc_xla, script, tmp_path):
    env = {} if HAVE_XLA else {"PYTHONPATH": stand_in_torch_xla(tmp_path)}
    code = ("import sys\nfrom acc.cli import main\n"
            f"try:\n    main(['launch', '--backend', 'xla', '--dry-run', {str(script)!r}, '--lr', '1'])\n"
            "except SystemExit as exc:\n    print('EXIT', exc.code)\n"
            f"print('LOADED', sorted(m for m in {LOADED!r} if m in sys.modules))\n")
    env = clean_env(tmp_path, **env)
    env.pop("PJRT_DEVICE", None)  # the lane sets it; the plan should choose it
    proc = subprocess.run([python_with_acc_xla, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout
    assert "EXIT 0" in out or "EXIT None" in out, out + proc.stderr
    assert "LOADED ['acc_xla.plugin']" in out  # the plugin, but neither torch nor torch_xla
    assert "engine     pjrt: torch_xla's PJRT launcher" in out
    assert "processes  1 per machine x 1 machine(s) = 1" in out
    assert "device     xla:0, the XLA CPU device (PJRT_DEVICE=CPU, auto: no TPU attached)" in out
    assert "worker environment additions: PJRT_DEVICE=CPU" in out
    assert f"command    python {script} --lr 1" in out


@pytest.mark.skipif(HAVE_XLA, reason="torch_xla is installed in this lane; the install message is tested in "
                                     "the main lane, where it is not")
def test_without_torch_xla_the_launch_says_how_to_install(python_with_acc_xla, script, tmp_path):
    proc = acc_cli(python_with_acc_xla, ["launch", "--backend", "xla", str(script)], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "plugin 'xla' (acc-xla 0.1.0) needs the module 'torch_xla', which is not installed" in err
    assert "pip install acc-xla" in err and "Traceback" not in err and "should not run" not in proc.stdout
    assert "torch-xla 2.9 needs torch 2.9, but this environment has torch 2.13" in err
    env = acc_cli(python_with_acc_xla, ["env"], tmp_path)
    assert env.returncode == 0 and "torch_xla              not installed; pip install acc-xla" in env.stdout


def test_fp16_is_refused_before_anything_starts(python_with_acc_xla, script, tmp_path):
    env = {} if HAVE_XLA else {"PYTHONPATH": stand_in_torch_xla(tmp_path)}
    proc = acc_cli(python_with_acc_xla, ["launch", "--backend", "xla", "--mixed-precision", "fp16", "--dry-run",
                                         str(script)], tmp_path, **env)
    assert proc.returncode == 2
    assert "mixed_precision 'fp16' is not supported by the xla backend" in proc.stderr
    assert "use --mixed-precision bf16" in proc.stderr
