"""Experiment tracking through the Accelerator (cpu backend, in this process): Accelerate's `log_with=`,
`init_trackers`, `log`, `trackers`, `get_tracker`, `end_training`; the log_with setting; an Accelerate-style
GeneralTracker subclass; a failing tracker does not cost the run its checkpoint. And the CLI: `acc plugins` lists
trackers, `acc launch --dry-run` shows them, `acc plot` says what it needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from acc import Accelerator
from acc.cli import cli
from acc.tracking import GeneralTracker, TrackerError, on_main_process


class MyTracker(GeneralTracker):
    """Written as Accelerate's documentation writes a custom tracker (only the import changed)."""

    name = "my_tracker"
    requires_logging_directory = False

    def __init__(self, run_name: str, fail_on_step: int | None = None):
        super().__init__()
        self.run_name, self.fail_on_step = run_name, fail_on_step
        self.events: list = []

    @on_main_process
    def start(self):
        self.events.append(("start", self.run_name))

    @property
    def tracker(self):
        return self.events

    @on_main_process
    def store_init_configuration(self, values: dict):
        self.events.append(("config", values))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        if step == self.fail_on_step:
            raise ConnectionError("the tracking server went away")
        self.events.append(("log", step, values))

    @on_main_process
    def finish(self):
        self.events.append(("finish",))


def _train(accelerator: Accelerator, steps: int = 4) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for step in range(steps):
        loss = model(torch.ones(2, 3)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"loss": loss.item(), "lr": 0.1}, step=step)
        losses.append(loss.item())
    return losses


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_jsonl_through_the_accelerator(fresh_pm, tmp_path):
    accelerator = Accelerator(plugin_manager=fresh_pm, log_with="jsonl", project_dir=str(tmp_path / "out"))
    assert accelerator.log_with == ["jsonl"] and accelerator.trackers == []
    accelerator.init_trackers("spirals", config={"lr": 0.1, "epochs": 2})
    assert [t.name for t in accelerator.trackers] == ["jsonl"]
    losses = _train(accelerator)
    path = accelerator.get_tracker("jsonl", unwrap=True)
    assert accelerator.get_tracker("jsonl") is accelerator.trackers[0]
    accelerator.end_training()
    lines = _lines(path)
    assert path.parent == tmp_path / "out" / "spirals"
    assert lines[1] == {"event": "config", "values": {"lr": 0.1, "epochs": 2}}
    assert [(r["step"], r["values"]["loss"]) for r in lines if r["event"] == "log"] == list(enumerate(losses))
    assert lines[-1]["event"] == "finish"


def test_without_log_with_everything_is_a_no_op(fresh_pm, tmp_path):
    accelerator = Accelerator(plugin_manager=fresh_pm)
    accelerator.init_trackers("p", config={"a": 1})
    accelerator.log({"loss": 1.0}, step=0)
    assert accelerator.trackers == [] and isinstance(accelerator.get_tracker("tensorboard"), GeneralTracker)
    accelerator.end_training()
    assert list(tmp_path.iterdir()) == [tmp_path / "user-config"] or not any(tmp_path.rglob("*.jsonl"))


def test_an_accelerate_style_tracker_object_gets_every_call(fresh_pm, tmp_path):
    mine = MyTracker("run-1")
    accelerator = Accelerator(plugin_manager=fresh_pm, log_with=[mine])
    accelerator.init_trackers("ignored-by-objects", config={"batch_size": 8})
    _train(accelerator, steps=2)
    assert accelerator.get_tracker("my_tracker", unwrap=True) is mine.events
    accelerator.end_training()
    assert [e[0] for e in mine.events] == ["start", "config", "log", "log", "finish"]
    assert mine.events[1] == ("config", {"batch_size": 8}) and [e[1] for e in mine.events[2:4]] == [0, 1]


def test_a_failing_tracker_is_named_and_the_run_keeps_its_checkpoint(fresh_pm, tmp_path, capfd):
    mine = MyTracker("run", fail_on_step=1)
    accelerator = Accelerator(plugin_manager=fresh_pm, log_with=["jsonl", mine], project_dir=str(tmp_path / "out"))
    accelerator.init_trackers("p")
    _train(accelerator, steps=4)
    accelerator.save_state(str(tmp_path / "ckpt"))
    path = accelerator.get_tracker("jsonl", unwrap=True)
    accelerator.end_training()
    err = capfd.readouterr().err
    assert "acc: tracker 'my_tracker' failed in log: ConnectionError: the tracking server went away" in err
    assert (tmp_path / "ckpt" / "manifest.json").exists()
    assert [r["step"] for r in _lines(path) if r["event"] == "log"] == [0, 1, 2, 3]
    assert [e[1] for e in mine.events if e[0] == "log"] == [0]


def test_an_uninstalled_tracker_accelerate_knows_is_left_out_with_a_note_as_accelerate_does(fresh_pm, tmp_path,
                                                                                               capfd):
    # Accelerate's examples pass log_with=["wandb"] whether wandb is installed or not; Accelerate drops it
    accelerator = Accelerator(plugin_manager=fresh_pm, log_with=["tensorboard", "jsonl"], project_dir=str(tmp_path))
    assert accelerator.log_with == ["jsonl"]
    accelerator.init_trackers("p")
    accelerator.log({"loss": 1.0}, step=0)
    accelerator.end_training()
    err = capfd.readouterr().err
    assert "tracker 'tensorboard' is not installed" in err and "pip install acc-tensorboard" in err
    assert "it is left out" in err and "missing_tracker = error" in err
    assert len(list((tmp_path / "p").glob("*.jsonl"))) == 1


@pytest.mark.parametrize("how", ["missing_tracker", "semantics"])
def test_an_uninstalled_tracker_is_an_error_with_missing_tracker_error(fresh_pm, tmp_path, monkeypatch, how):
    monkeypatch.setenv(*(("ACC_MISSING_TRACKER", "error") if how == "missing_tracker" else ("ACC_SEMANTICS", "acc")))
    with pytest.raises(TrackerError, match="tracker 'tensorboard' is not installed.*pip install acc-tensorboard"):
        Accelerator(plugin_manager=fresh_pm, log_with="tensorboard", project_dir=str(tmp_path))


def test_a_tracker_name_accelerate_does_not_know_is_an_error_either_way(fresh_pm, tmp_path):
    with pytest.raises(TrackerError, match="tracker 'tensorbaord' is not installed"):
        Accelerator(plugin_manager=fresh_pm, log_with="tensorbaord", project_dir=str(tmp_path))


def test_the_log_with_setting_chooses_and_the_code_overrides_it(fresh_pm, tmp_path, monkeypatch):
    monkeypatch.setenv("ACC_LOG_WITH", "jsonl")
    accelerator = Accelerator(plugin_manager=fresh_pm, project_dir=str(tmp_path / "out"))
    assert accelerator.log_with == ["jsonl"]
    accelerator.init_trackers("from-env")
    accelerator.log({"x": 1}, step=0)
    accelerator.end_training()
    assert len(list((tmp_path / "out" / "from-env").glob("*.jsonl"))) == 1
    with pytest.warns(UserWarning, match=r"overrides log_with=\['jsonl'\] from env ACC_LOG_WITH"):
        accelerator = Accelerator(plugin_manager=fresh_pm, log_with=[MyTracker("r")])
    assert [t.name for t in accelerator.log_with] == ["my_tracker"]
    accelerator.end_training()


def test_log_with_in_the_project_file(fresh_pm, tmp_path):
    (tmp_path / "acc.toml").write_text('log_with = ["jsonl"]\n')
    accelerator = Accelerator(plugin_manager=fresh_pm, project_dir=str(tmp_path / "out"))
    assert accelerator.log_with == ["jsonl"] and accelerator.settings.source("log_with").startswith("project")
    accelerator.end_training()


# ------------------------------------------------------------------------------------------- the CLI
def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False, prog_name="acc")


def test_acc_plugins_lists_the_trackers():
    out = invoke("plugins").output
    assert "trackers (entry-point group acc.trackers" in out
    assert "  jsonl  (acc-core 0.1.0, builtin)\n    class     acc.builtin.jsonl:JSONLinesTracker" in out
    rows = json.loads(invoke("plugins", "--json").output)
    assert [r["name"] for r in rows if r["group"] == "acc.trackers"][0] == "jsonl"


def test_the_dry_run_shows_the_trackers_and_where_the_setting_came_from(tmp_path):
    (tmp_path / "train.py").write_text("pass\n")
    out = invoke("launch", "--dry-run", "--log-with", "jsonl,tensorboard", "train.py").output
    assert "trackers   jsonl (acc-core 0.1.0), tensorboard (NOT installed: install with: pip install " \
           "acc-tensorboard)" in out
    assert "log_with" in out and "flag --log-with" in out
    out = invoke("launch", "--dry-run", "train.py", env={"ACC_LOG_WITH": "all"}).output
    assert "trackers   all = jsonl" in out and "env ACC_LOG_WITH" in out


def test_acc_plot_without_matplotlib_says_how_to_install_it(tmp_path):
    accelerator_free = ("import sys, importlib.abc\n"
                        "class Block(importlib.abc.MetaPathFinder):\n"
                        "    def find_spec(self, name, path, target=None):\n"
                        "        if name.split('.')[0] == 'matplotlib':\n"
                        "            raise ImportError('No module named matplotlib')\n"
                        "sys.meta_path.insert(0, Block())\n"
                        "from acc.cli import main; main(sys.argv[1:])\n")
    run = tmp_path / "p" / "demo"
    run.mkdir(parents=True)
    (run / "r.jsonl").write_text('{"event":"run","project":"demo","run":"r"}\n'
                                 '{"event":"log","step":0,"values":{"loss":1.0}}\n')
    proc = subprocess.run([sys.executable, "-c", accelerator_free, "plot", str(tmp_path / "p")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "pip install 'acc-core[plot]'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "empty").mkdir()
    empty = invoke("plot", str(tmp_path / "empty"))
    assert empty.exit_code == 2 and "no run file of the jsonl tracker" in empty.output


SCRIPT = """
import sys
from acc import Accelerator
accelerator = Accelerator(log_with="jsonl", project_dir=sys.argv[1])
accelerator.init_trackers("p")
for step in range(3):
    accelerator.log({"loss": 1.0 / (step + 1)}, step=step)
if sys.argv[2] == "raise":
    raise RuntimeError("diverged")
"""


@pytest.mark.parametrize("how", ["plain", "raise", "ddp"])
def test_a_script_that_skips_end_training_or_fails_keeps_every_logged_line(tmp_path, how):
    from tests.conftest import ACC, clean_env

    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    launch = [sys.executable] if how != "ddp" else [ACC, "launch", "--backend", "ddp", "--nproc", "2",
                                                     "--output-dir", ""]
    proc = subprocess.run([*launch, str(script), str(tmp_path / "out"), how], cwd=tmp_path, env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == (1 if how == "raise" else 0), proc.stderr[-3000:]
    (path,) = (tmp_path / "out" / "p").glob("*.jsonl")
    assert [r["step"] for r in _lines(path) if r["event"] == "log"] == [0, 1, 2]
