"""Entry-point discovery through a real editable install of a small test plugin (tests/fixtures/acc_widget)."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import ROOT, clean_env, overlay_venv, pip_install_editable, run


@pytest.fixture(scope="module")
def widget_python(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("widget")
    source = tmp / "acc_widget"
    shutil.copytree(ROOT / "tests" / "fixtures" / "acc_widget", source)
    python = overlay_venv(tmp)
    pip_install_editable(python, source, tmp)
    return python


def test_installed_backend_appears_in_acc_plugins(widget_python, tmp_path):
    proc = run([str(widget_python), "-m", "acc", "plugins"], tmp_path)
    assert "widget  (acc-widget 0.3.1)" in proc.stdout
    assert "widget-notes  (acc-widget 0.3.1)" in proc.stdout
    # the broken backend is listed with its import error, and the command says something is wrong
    assert "broken  (acc-widget 0.3.1)" in proc.stdout
    assert "No module named 'acc_widget_missing_dependency'" in proc.stdout
    assert proc.returncode == 1


def test_launch_on_the_installed_backend_with_its_own_flag(widget_python, tmp_path):
    (tmp_path / "show.py").write_text(
        "from acc import Accelerator\na = Accelerator()\n"
        "print('backend', a.backend, 'widgets', a.settings['widgets'], 'device', a.device)\n"
    )
    dry = run([str(widget_python), "-m", "acc", "launch", "--backend", "widget", "--widgets", "5", "-p",
               "widget-notes", "--dry-run", "show.py"], tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "backend    widget (acc-widget 0.3.1)" in dry.stdout and "device     5 widgets" in dry.stdout
    assert "note: widget-notes was here" in dry.stdout
    assert "widgets" in dry.stdout and "flag --widgets" in dry.stdout
    proc = run([str(widget_python), "-m", "acc", "launch", "--backend", "widget", "--widgets", "5", "show.py"],
               tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "backend widget widgets 5 device cpu"


def test_backend_options_are_listed_in_launch_help(widget_python, tmp_path):
    proc = run([str(widget_python), "-m", "acc", "launch", "--backend", "widget", "--help"], tmp_path)
    assert proc.returncode == 0 and "--widgets INT" in proc.stdout and "env ACC_WIDGETS" in proc.stdout


def test_backend_that_fails_to_import_is_a_clear_error(widget_python, tmp_path):
    (tmp_path / "t.py").write_text("")
    proc = run([str(widget_python), "-m", "acc", "launch", "--backend", "broken", "t.py"], tmp_path)
    assert proc.returncode == 2
    assert "plugin 'broken' (acc-widget 0.3.1) failed to import module acc_widget.broken" in proc.stderr
    assert "ModuleNotFoundError: No module named 'acc_widget_missing_dependency'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_backend_chosen_by_environment_in_a_plain_python_run(widget_python, tmp_path):
    (tmp_path / "show.py").write_text("from acc import Accelerator\nprint(Accelerator().backend)\n")
    proc = run([str(widget_python), "show.py"], tmp_path, env=clean_env(tmp_path, ACC_BACKEND="widget"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "widget"
