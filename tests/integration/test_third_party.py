"""A backend written from the template outside the repo: installed with pip, listed, conformant, runnable on 2
processes; and a plugin that targets the wrong hook-spec version or misspells a hook is refused by name."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import ACC, ROOT, clean_env, overlay_venv, pip_install_editable, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A directory outside the repository with a venv that sees this one's packages."""
    tmp = tmp_path_factory.mktemp("third-party")
    assert ROOT not in tmp.parents
    return tmp, overlay_venv(tmp)


def test_a_backend_from_the_template_installs_passes_the_suite_and_runs(outside):
    tmp, python = outside
    made = run([ACC, "new-backend", "gizmo", "--dir", str(tmp / "acc-gizmo")], tmp)
    assert made.returncode == 0, made.stderr
    pip_install_editable(python, tmp / "acc-gizmo", tmp)
    listed = run([str(python), "-m", "acc", "plugins"], tmp)
    assert "gizmo  (acc-gizmo 0.1.0)" in listed.stdout, listed.stdout
    pytest_cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    collected = subprocess.run([*pytest_cmd, "--collect-only"], cwd=tmp / "acc-gizmo", env=clean_env(tmp),
                               capture_output=True, text=True, timeout=300)
    count = int(re.search(r"(\d+) tests? collected", collected.stdout).group(1))
    assert count >= 15, collected.stdout[-2000:]  # the kit's tests and the template's own
    suite = subprocess.run(pytest_cmd, cwd=tmp / "acc-gizmo",
                           env=clean_env(tmp), capture_output=True, text=True, timeout=900)
    summary = suite.stdout.strip().splitlines()[-1]
    assert suite.returncode == 0 and summary.startswith(f"{count} passed") and "skipped" not in summary, \
        suite.stdout[-3000:]
    checked = run([str(python), "-m", "acc", "check", "--backend", "gizmo", "--nproc", "2"], tmp, timeout=300)
    assert checked.returncode == 0 and checked.stdout.count("PASS") == 8, checked.stdout + checked.stderr
    trained = run([str(python), "-m", "acc", "launch", "--backend", "gizmo", "--nproc", "2", "--output-dir", "",
                   str(ROOT / "examples" / "quickstart.py"), "--epochs", "3"], tmp, timeout=300)
    assert trained.returncode == 0, trained.stderr
    assert "training on 2 process(es), backend gizmo" in trained.stdout and "500 samples" in trained.stdout


@pytest.mark.parametrize("breakage,message", [
    (("ACC_HOOKSPEC_VERSION = 2", "ACC_HOOKSPEC_VERSION = 99"),
     "plugin 'broken' targets hook-spec version 99, but this acc-core"),
    (("def acc_setup(", "def acc_setups("), "plugin 'broken' defines acc_setups(), which is not an acc hook"),
])
def test_an_installed_plugin_with_a_wrong_contract_is_refused_by_name(outside, breakage, message):
    tmp, python = outside
    source = tmp / f"acc-broken-{breakage[1][:12].replace(' ', '')}"
    shutil.rmtree(source, ignore_errors=True)
    assert run([ACC, "new-backend", "broken", "--dir", str(source)], tmp).returncode == 0
    plugin = source / "acc_broken" / "plugin.py"
    plugin.write_text(plugin.read_text().replace(*breakage))
    pip_install_editable(python, source, tmp)
    proc = run([str(python), "-m", "acc", "launch", "--backend", "broken", "--dry-run", "x.py"], tmp)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_new_backend_refuses_bad_names_and_non_empty_directories(tmp_path):
    bad = run([ACC, "new-backend", "My-Backend"], tmp_path)
    assert bad.returncode == 2 and "use lower-case letters" in bad.stderr
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    taken = run([ACC, "new-backend", "ok", "--dir", str(tmp_path / "taken")], tmp_path)
    assert taken.returncode == 2 and "exists and is not empty" in taken.stderr


def test_the_timing_plugin_composes_with_any_backend(tmp_path):
    proc = run([ACC, "launch", "-p", "timing", "--backend", "ddp", "--nproc", "2", "--output-dir", "",
                str(ROOT / "examples" / "quickstart.py"), "--epochs", "1"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "timing (this process):" in proc.stdout
    assert "backward" in proc.stdout and "optimizer step" in proc.stdout and "32 calls" in proc.stdout
    blocked = run([ACC, "launch", "-p", "timing", "-p", "no:timing", "--output-dir", "",
                   str(ROOT / "examples" / "quickstart.py"), "--epochs", "1"], tmp_path, timeout=300)
    assert blocked.returncode == 0 and "timing (this process)" not in blocked.stdout
