"""A tracker published by someone else: a package outside the repo declaring an entry point in `acc.trackers`,
pip-installed into a venv. `acc plugins` lists it, `log_with="widget"` and `log_with="all"` choose it, and on 2 ddp
processes it receives every step once."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, overlay_venv, pip_install_editable, run

pytestmark = pytest.mark.slow

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "acc-widget-tracker"
version = "0.3.0"
dependencies = ["acc-core"]

[project.entry-points."acc.trackers"]
widget = "acc_widget_tracker:WidgetTracker"

[tool.setuptools]
packages = ["acc_widget_tracker"]
"""

MODULE = '''\
"""A tracker that writes one tab-separated line per logged value."""
import os

from acc.tracking import GeneralTracker, on_main_process


class WidgetTracker(GeneralTracker):
    name = "widget"
    requires_logging_directory = True

    def __init__(self, run_name, logging_dir, **kwargs):
        super().__init__()
        self.path = os.path.join(logging_dir, run_name, "widget.tsv")

    @property
    def tracker(self):
        return self.path

    @on_main_process
    def start(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.file = open(self.path, "x")

    @on_main_process
    def store_init_configuration(self, values):
        self.file.write("config\\t" + ",".join(sorted(values)) + "\\n")

    @on_main_process
    def log(self, values, step=None, **kwargs):
        for key, value in values.items():
            if hasattr(value, "numel") and value.numel() == 1:
                value = value.item()
            self.file.write(f"{step}\\t{key}\\t{value}\\n")

    @on_main_process
    def finish(self):
        self.file.close()
'''


@pytest.fixture(scope="module")
def widget_python(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("third-party-tracker")
    assert ROOT not in tmp.parents
    source = tmp / "acc-widget-tracker"
    (source / "acc_widget_tracker").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "acc_widget_tracker" / "__init__.py").write_text(MODULE)
    python = overlay_venv(tmp)
    pip_install_editable(python, source, tmp)
    return python


def test_an_installed_tracker_is_listed(widget_python, tmp_path):
    listed = run([str(widget_python), "-m", "acc", "plugins"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    trackers = listed.stdout.split("trackers (entry-point group acc.trackers")[1]
    assert "  widget  (acc-widget-tracker 0.3.0)\n    class     acc_widget_tracker:WidgetTracker" in trackers
    rows = json.loads(run([str(widget_python), "-m", "acc", "plugins", "--json"], tmp_path).stdout)
    assert {r["name"] for r in rows if r["group"] == "acc.trackers"} == {"jsonl", "widget"}
    (tmp_path / "x.py").write_text("pass\n")
    dry = run([str(widget_python), "-m", "acc", "launch", "--dry-run", "--log-with", "widget", "x.py"], tmp_path)
    assert "trackers   widget (acc-widget-tracker 0.3.0)" in dry.stdout, dry.stdout + dry.stderr


@pytest.mark.parametrize("log_with", ["widget", "all"])
def test_it_receives_every_step_once_on_two_ddp_processes(widget_python, tmp_path, log_with):
    out, project = tmp_path / "out", tmp_path / "project"
    proc = run([str(widget_python), "-m", "acc", "launch", "--backend", "ddp", "--nproc", "2", "--output-dir", "",
                str(ROOT / "tests" / "workers" / "tracking_train.py"), "--out", str(out), "--project-dir",
                str(project), "--log-with", log_with, "--steps", "4"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["trackers"] == (["widget"] if log_with == "widget" else ["jsonl", "widget"])
    assert ranks[1]["trackers"] == []
    lines = [line.split("\t") for line in (project / "demo" / "widget.tsv").read_text().splitlines()]
    assert lines[0] == ["config", "layers,lr,optimizer,scheduler,steps"]
    losses = [(int(step), float(value)) for step, key, value in lines[1:] if key == "loss"]
    assert [s for s, _ in losses] == [0, 1, 2, 3]
    assert all(abs(v - ranks[0]["losses"][s]) < 1e-6 for s, v in losses)
