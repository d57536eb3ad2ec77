"""The tracker plugins for real, in the trackers venv (scripts/trackers-venv.sh): a training script written against
Accelerate's tracking API logs through tensorboard, mlflow, wandb (offline) and the built-in jsonl at once, and
each run is read back with the tracker's own library (tensorboard's event reader, MlflowClient, W&B's run-file
records; jsonl by parsing). On 2 ddp processes exactly one run exists per tracker, holding every step. A tracker
that fails is named and the run keeps its checkpoint. `acc plot` draws the jsonl runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.plugins.trackers.conftest import read_back, run_py, train

pytestmark = pytest.mark.slow

TRACKERS = ["jsonl", "mlflow", "tensorboard", "wandb"]
STEPS = 5


def jsonl_runs(project: Path) -> list[list[dict]]:
    return [[json.loads(line) for line in p.read_text().splitlines()] for p in sorted(project.rglob("*.jsonl"))]


def close(a: list[float], b: list[float], tol: float = 1e-6) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=tol, abs_tol=tol) for x, y in zip(a, b))


def check_one_run_each(python: Path, project: Path, losses: list[float], tmp_path: Path) -> None:
    """Exactly one run per tracker under `project`, holding steps 0..STEPS-1 with these losses."""
    steps = list(range(STEPS))
    (run,) = jsonl_runs(project)
    logs = [r for r in run if r["event"] == "log"]
    assert [r["step"] for r in logs] == steps and close([r["values"]["loss"] for r in logs], losses)
    assert run[1] == {"event": "config", "values": {"lr": 0.1, "steps": STEPS, "layers": [4, 1], "scheduler": None,
                                                    "optimizer": "sgd"}}

    board = read_back(python, "tensorboard", project, tmp_path)
    assert len(board["files"]) == 1 and list(board["runs"]) == ["demo"], board["files"]
    demo = board["runs"]["demo"]
    assert [s for s, _ in demo["scalars"]["loss"]] == steps
    assert close([v for _, v in demo["scalars"]["loss"]], losses, tol=1e-6)  # stored as float32
    assert demo["hparams"] == {"lr": 0.1, "steps": float(STEPS), "layers": "[4, 1]", "scheduler": "None",
                               "optimizer": "sgd"}
    assert demo["text"]["phase/text_summary"] == steps and demo["text"]["sample/text_summary"] == [0]

    store = read_back(python, "mlflow", f"sqlite:///{project / 'mlflow.db'}", tmp_path)
    (mlrun,) = store["demo"]
    assert mlrun["status"] == "FINISHED"
    assert mlrun["params"] == {"lr": "0.1", "steps": str(STEPS), "layers": "[4, 1]", "scheduler": "None",
                               "optimizer": "sgd"}
    assert [s for s, _ in mlrun["metrics"]["loss"]] == steps and close([v for _, v in mlrun["metrics"]["loss"]],
                                                                        losses)
    assert set(mlrun["metrics"]) == {"loss", "lr"}  # the string and the tensor are not MLflow metrics

    (wrun,) = read_back(python, "wandb", project, tmp_path)["runs"]
    assert wrun["project"] == "demo"
    assert {k: wrun["config"][k] for k in ("lr", "steps", "layers", "scheduler")} == \
        {"lr": 0.1, "steps": STEPS, "layers": [4, 1], "scheduler": None}
    rows = [row for row in wrun["history"] if "loss" in row]
    assert [row["_step"] for row in rows] == steps and close([row["loss"] for row in rows], losses)
    assert rows[-1]["validation_note"] == "a validation sample"


def test_every_tracker_logs_one_run_that_its_own_library_reads_back(trackers_python, tmp_path):
    proc, ranks = train(trackers_python, tmp_path, "--log-with", "all")
    record = ranks[0]
    assert record["log_with"] == TRACKERS and record["trackers"] == TRACKERS
    assert record["unwrapped"] == {"jsonl": "PosixPath", "mlflow": "ActiveRun", "tensorboard": "SummaryWriter",
                                   "wandb": "Run"}
    check_one_run_each(trackers_python, tmp_path / "run" / "project", record["losses"], tmp_path)
    err = proc.stderr
    for tracker in ("tensorboard", "mlflow"):  # hyper-parameters converted, and said
        assert f"acc: tracker '{tracker}' stores hyper-parameters as numbers, booleans and strings; converted to " \
               "strings: layers (a list of 2 items) -> '[4, 1]'; scheduler (None) -> 'None'" in err
    for tracker in ("jsonl", "tensorboard", "mlflow"):  # non-scalars named, once
        assert err.count(f"acc: tracker '{tracker}' cannot store 'weights' (a Tensor of shape (3,))") == 1
    assert "acc: tracker 'mlflow' cannot store 'phase' (a str): it stores numbers" in err
    assert "failed" not in err


def test_two_ddp_processes_make_exactly_one_run_per_tracker_with_every_step(trackers_python, tmp_path):
    proc, ranks = train(trackers_python, tmp_path, "--log-with", "all", nproc=2)
    assert ranks[0]["trackers"] == TRACKERS and ranks[1]["trackers"] == []
    assert ranks[1]["log_with"] == TRACKERS and ranks[1]["blank"] == "GeneralTracker"  # no-ops, never a 2nd run
    assert ranks[0]["losses"] == ranks[1]["losses"]
    check_one_run_each(trackers_python, tmp_path / "run" / "project", ranks[0]["losses"], tmp_path)


def test_the_setting_chooses_the_trackers_when_the_script_leaves_log_with_to_it(trackers_python, tmp_path):
    _, ranks = train(trackers_python, tmp_path, "--log-with", "setting", ACC_LOG_WITH="tensorboard,jsonl")
    assert ranks[0]["trackers"] == ["tensorboard", "jsonl"]
    board = read_back(trackers_python, "tensorboard", tmp_path / "run" / "project", tmp_path)
    assert [s for s, _ in board["runs"]["demo"]["scalars"]["loss"]] == list(range(STEPS))


def test_an_unwritable_directory_is_named_per_tracker_and_the_run_keeps_its_checkpoint(trackers_python, tmp_path):
    project = tmp_path / "run" / "project"
    project.parent.mkdir(parents=True)
    project.write_text("a file where the project directory should be")
    proc, ranks = train(trackers_python, tmp_path, "--log-with", "all", "--save", str(tmp_path / "ckpt"))
    err = proc.stderr
    for tracker in TRACKERS:
        assert f"acc: tracker '{tracker}' failed in start: " in err, err[-4000:]
    assert err.count("switched off for the rest of this run (training continues") == len(TRACKERS)
    assert ranks[0]["trackers"] == [] and len(ranks[0]["losses"]) == STEPS
    assert (tmp_path / "ckpt" / "manifest.json").exists()


def test_a_library_error_switches_that_tracker_off_and_the_others_log_every_step(trackers_python, tmp_path):
    kwargs = {"mlflow": {"tracking_uri": "nosuchstore://nowhere"}}
    proc, ranks = train(trackers_python, tmp_path, "--log-with", "jsonl,mlflow,tensorboard", "--init-kwargs",
                        json.dumps(kwargs))
    assert "acc: tracker 'mlflow' failed in start: " in proc.stderr and "nosuchstore" in proc.stderr
    assert ranks[0]["trackers"] == ["jsonl", "tensorboard"]
    project = tmp_path / "run" / "project"
    (run,) = jsonl_runs(project)
    assert [r["step"] for r in run if r["event"] == "log"] == list(range(STEPS))
    board = read_back(trackers_python, "tensorboard", project, tmp_path)
    assert [s for s, _ in board["runs"]["demo"]["scalars"]["loss"]] == list(range(STEPS))


def test_acc_plot_overlays_runs_one_panel_per_metric(trackers_python, tmp_path):
    for lr in ("0.1", "0.01"):
        train(trackers_python, tmp_path, "--log-with", "jsonl", "--lr", lr, "--project", f"lr-{lr}", name="runs")
    project = tmp_path / "runs" / "project"
    out = tmp_path / "plots" / "compare.png"
    proc = run_py(trackers_python, ["-m", "acc", "plot", str(project / "lr-0.1"), str(project / "lr-0.01"), "-o",
                                    str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote {out}: 2 metric(s) (loss, lr) from 2 run(s)"
    shape = run_py(trackers_python, ["-c", f"import matplotlib.image as m; print(m.imread({str(out)!r}).shape)"],
                   tmp_path)
    assert shape.stdout.strip() == "(340, 1000, 4)"  # two 5 x 3.4 inch panels side by side at 100 dpi
    one = run_py(trackers_python, ["-m", "acc", "plot", str(project), "-m", "loss", "--log-y", "-o",
                                   str(tmp_path / "loss.png")], tmp_path)
    assert one.returncode == 0 and "1 metric(s) (loss) from 2 run(s)" in one.stdout, one.stderr
    missing = run_py(trackers_python, ["-m", "acc", "plot", str(project), "-m", "accuracy"], tmp_path)
    assert missing.returncode == 2 and "no run logged accuracy; logged: loss, lr" in missing.stderr
