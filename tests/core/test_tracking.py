"""acc.tracking without the trackers' libraries: GeneralTracker's contract, discovery through entry-point metadata,
choosing trackers (errors with the install command), the built-in jsonl tracker read back by parsing, hyper-
parameters stored once and converted with a message, failures that switch one tracker off while training goes
on, the main process only. `Trackers` is driven here with a stand-in for the Accelerator (what it reads of one);
tests/core/test_tracking_accelerator.py drives it through the real Accelerator."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest

from acc.builtin.jsonl import find_runs, read_run
from acc.contract.settings import ResolvedSettings
from acc.tracking import (
    LOGGER_TYPE_TO_CLASS,
    GeneralTracker,
    TrackerError,
    Trackers,
    filter_trackers,
    get_available_trackers,
    installed_trackers,
    on_main_process,
    register_tracker_class,
)
from acc.tracking.registry import choose


def accelerator(tmp_path: Path | None, main: bool = True, log_with: list | None = None, source: str = "default",
                missing: str = "skip"):
    """What Trackers reads of an Accelerator."""
    settings = ResolvedSettings({"log_with": list(log_with or []), "missing_tracker": missing},
                                {"log_with": source, "missing_tracker": "default"})
    directory = None if tmp_path is None else str(tmp_path / "project")
    return types.SimpleNamespace(is_main_process=main, process_index=0 if main else 1, logging_dir=directory,
                                 project_dir=directory, settings=settings)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class Recorder(GeneralTracker):
    """A tracker written as for Accelerate: name, requires_logging_directory, tracker, the four methods."""

    name = "recorder"
    requires_logging_directory = False

    def __init__(self, run_name: str = "r", fail_in: str | None = None, main_process_only: bool = True):
        super().__init__()
        self.run_name, self.fail_in, self.main_process_only = run_name, fail_in, main_process_only
        self.calls: list = []

    @property
    def tracker(self):
        return self.calls

    def _record(self, what, *args):
        if what == self.fail_in:
            raise RuntimeError(f"the library broke in {what}")
        self.calls.append((what, *args))

    def start(self):
        self._record("start")

    def store_init_configuration(self, values):
        self._record("config", dict(values))

    def log(self, values, step=None, **kwargs):
        self._record("log", dict(values), step, kwargs)

    def finish(self):
        self._record("finish")


# ------------------------------------------------------------------------------------------- the contract
def test_a_tracker_missing_accelerates_required_attributes_is_refused_with_accelerates_message():
    class Incomplete(GeneralTracker):
        name = "x"

    with pytest.raises(NotImplementedError, match="missing the following required attributes.*"
                                                  "`requires_logging_directory`, `tracker`"):
        Incomplete()
    blank = GeneralTracker(_blank=True)  # what get_tracker gives where nothing runs: every method does nothing
    assert blank.log({"a": 1}) is None and blank.finish() is None and blank.main_process_only is True


def test_on_main_process_follows_the_trackers_main_process_only(monkeypatch):
    class T:
        main_process_only = True

        @on_main_process
        def f(self):
            return "ran"

    from acc.runtime import worker as runtime

    monkeypatch.setitem(runtime._CURRENT, "runtime", None)  # no run in this process: the launcher's RANK decides
    monkeypatch.setenv("RANK", "1")
    assert T().f() is None
    T.main_process_only = False
    assert T().f() == "ran"
    monkeypatch.setenv("RANK", "0")
    T.main_process_only = True
    assert T().f() == "ran"


def test_discovery_reads_metadata_only_and_the_builtin_comes_first():
    code = ("import sys, acc.tracking as t; names = list(t.installed_trackers()); "
            "print(names[0], 'acc.builtin.jsonl' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["jsonl", "False", "False"]
    info = installed_trackers()["jsonl"]
    assert (info.group, info.distribution, info.module) == ("acc.trackers", "acc-core",
                                                            "acc.builtin.jsonl:JSONLinesTracker")


# ------------------------------------------------------------------------------------------- choosing
def test_a_first_party_tracker_that_is_not_installed_is_an_error_with_its_install_command(tmp_path):
    from acc.contract.enums import LoggerType

    assert "tensorboard" not in installed_trackers()  # .venv never holds the trackers' libraries
    strict = accelerator(tmp_path, missing="error")
    for given in ("tensorboard", LoggerType.TENSORBOARD, ["jsonl", "tensorboard"]):
        with pytest.raises(TrackerError, match=r"tracker 'tensorboard' is not installed.*pip install acc-tensorboard"):
            Trackers(given, strict)
    with pytest.raises(ValueError, match="pip install acc-mlflow"):  # Accelerate's type for these errors
        Trackers("mlflow", strict)
    with pytest.raises(TrackerError, match=r"'comet_ml'.*acc has no 'comet_ml' tracker.*entry point in the group "
                                           r"'acc.trackers'.*log_with=\[MyTracker"):
        Trackers("comet_ml", strict)
    with pytest.raises(TrackerError, match=r"'jsnl' is not installed \(did you mean 'jsonl'\?\)"):
        Trackers("jsnl", strict)


def test_by_default_an_uninstalled_tracker_accelerate_knows_is_left_out_with_the_same_words(tmp_path):
    trackers = Trackers(["wandb", "jsonl", "tensorboard"], accelerator(tmp_path))
    assert trackers.log_with == ["jsonl"]
    assert [n.split(": ")[1].split(" is not")[0] for n in trackers._notes] == ["tracker 'wandb'", "tracker 'tensorboard'"]
    assert all("pip install acc-" in n and "it is left out" in n for n in trackers._notes)
    with pytest.raises(TrackerError, match=r"'jsnl' is not installed"):  # a name Accelerate does not know: an error
        Trackers(["jsnl"], accelerator(tmp_path))


def test_a_tracker_that_writes_under_a_logging_directory_needs_one():
    with pytest.raises(TrackerError, match="logging with `jsonl` requires a `logging_dir`.*project_dir="):
        Trackers("jsonl", accelerator(None))
    chosen, notes, _ = choose("all", None)  # "all": left out, with the reason
    assert "jsonl" not in chosen and "leaves out tracker 'jsonl'" in notes[0] and "project_dir" in notes[0]


def test_all_means_every_installed_tracker_plus_the_objects_given_and_duplicates_count_once(tmp_path):
    mine = Recorder()
    chosen, notes, _ = choose(["all", mine, "jsonl"], tmp_path)
    assert chosen == [mine, *installed_trackers()] and not notes
    assert filter_trackers(["jsonl", "jsonl"], tmp_path) == ["jsonl"]
    with pytest.raises(TrackerError, match="Recorder is a class; pass a tracker object"):
        choose([Recorder], tmp_path)
    with pytest.raises(TrackerError, match="neither a tracker name nor a tracker object"):
        choose([42], tmp_path)


def test_the_setting_is_used_when_the_code_gives_none_and_errors_name_its_source(tmp_path):
    trackers = Trackers(None, accelerator(tmp_path, log_with=["jsonl"], source="env ACC_LOG_WITH"))
    assert trackers.log_with == ["jsonl"]
    with pytest.raises(TrackerError, match=r"log_with \(env ACC_LOG_WITH\): tracker 'wandb' is not installed"):
        Trackers(None, accelerator(tmp_path, log_with=["wandb"], source="env ACC_LOG_WITH"))
    assert Trackers(None, accelerator(tmp_path)).log_with == []


def test_the_code_argument_overrides_the_setting_and_says_so_when_they_contradict(tmp_path):
    with pytest.warns(UserWarning, match=r"log_with=\['recorder'\]\) overrides log_with=\['jsonl'\] from env "
                                         "ACC_LOG_WITH"):
        trackers = Trackers([Recorder()], accelerator(tmp_path, log_with=["jsonl"], source="env ACC_LOG_WITH"))
    assert [t.name for t in trackers.log_with] == ["recorder"]


def test_accelerates_registry_names_work(tmp_path):
    assert "jsonl" in LOGGER_TYPE_TO_CLASS and LOGGER_TYPE_TO_CLASS["jsonl"].__name__ == "JSONLinesTracker"
    assert get_available_trackers()[0] == "jsonl"

    class Registered(Recorder):
        name = "registered_tracker"

    register_tracker_class(Registered)
    try:
        trackers = Trackers("registered_tracker", accelerator(tmp_path))
        trackers.init("proj", init_kwargs={"registered_tracker": {"fail_in": "nothing"}})
        made = trackers.trackers[0]  # Accelerate's convention: the project name first, then init_kwargs
        assert isinstance(made, Registered) and (made.run_name, made.fail_in) == ("proj", "nothing")
        with pytest.raises(ValueError, match="must be a subclass of `GeneralTracker`"):
            register_tracker_class(dict)
    finally:
        from acc.tracking import registry

        registry._REGISTERED.pop("registered_tracker", None)


def test_the_registry_snapshots_and_restores_as_a_dict_does():
    class Shadow(Recorder):
        name = "shadow_tracker"

    snapshot = dict(LOGGER_TYPE_TO_CLASS)
    assert "jsonl" in snapshot and "shadow_tracker" not in snapshot
    register_tracker_class(Shadow)
    with pytest.warns(UserWarning, match="'shadow_tracker' is already registered"):
        register_tracker_class(Shadow)
    LOGGER_TYPE_TO_CLASS.clear()
    assert len(LOGGER_TYPE_TO_CLASS) == 0 and "jsonl" not in LOGGER_TYPE_TO_CLASS
    LOGGER_TYPE_TO_CLASS.update(snapshot)
    assert dict(LOGGER_TYPE_TO_CLASS) == snapshot  # the tracker registered in between is gone, jsonl is back
    with pytest.raises(KeyError):
        del LOGGER_TYPE_TO_CLASS["shadow_tracker"]


def test_accelerates_tracker_classes_import_by_name_and_building_a_missing_one_says_what_to_install():
    from acc.tracking import GeneralTracker, JSONLinesTracker, TensorBoardTracker

    assert JSONLinesTracker.name == "jsonl"
    # not installed here: the name imports (Accelerate's tests import it and skip by require_*), building it fails
    assert issubclass(TensorBoardTracker, GeneralTracker) and TensorBoardTracker.name == "tensorboard"
    with pytest.raises(ImportError, match="tracker 'tensorboard' is not installed; install with: pip install "
                                          "acc-tensorboard"):
        TensorBoardTracker("run", "logs")


# ------------------------------------------------------------------------------------------- the jsonl tracker
def test_jsonl_writes_one_file_per_run_with_config_once_and_every_log(tmp_path, capsys):
    import numpy as np
    import torch

    trackers = Trackers("jsonl", accelerator(tmp_path))
    config = {"lr": 0.1, "layers": [64, 64], "scheduler": None, "device": torch.device("cpu"), "tag": "x"}
    trackers.init("demo", config=config)
    trackers.init("demo", config={"lr": 99})  # a second call: nothing more is stored
    for step in range(3):
        trackers.log({"loss": 1.0 / (step + 1), "acc": torch.tensor(0.5), "n": np.int64(step), "note": "hi",
                      "per_class": {"a": 1, "b": torch.tensor([2.0])}, "hist": torch.ones(3)}, step=step)
    trackers.log({"loss": 0.1})  # no step
    path = trackers.get("jsonl", unwrap=True)
    trackers.finish()
    trackers.finish()  # idempotent
    trackers.log({"loss": 0.0}, step=9)  # after the end: ignored, said once
    assert list(find_runs([tmp_path])) == [path] and path.parent == tmp_path / "project" / "demo"
    lines = records(path)
    assert [r["event"] for r in lines] == ["run", "config", "log", "log", "log", "log", "finish"]
    assert lines[0]["project"] == "demo" and lines[0]["run"] == path.stem
    assert lines[1]["values"] == {"lr": 0.1, "layers": [64, 64], "scheduler": None, "device": "cpu", "tag": "x"}
    assert lines[2]["values"] == {"loss": 1.0, "acc": 0.5, "n": 0, "note": "hi", "per_class/a": 1,
                                  "per_class/b": 2.0}
    assert [r["step"] for r in lines[2:6]] == [0, 1, 2, None]
    err = capsys.readouterr().err
    assert "tracker 'jsonl' stores hyper-parameters as numbers, booleans, strings, None, lists and dicts; " \
           "converted to strings: device (a device) -> 'cpu'" in err
    assert err.count("tracker 'jsonl' cannot store 'hist' (a Tensor of shape (3,))") == 1
    assert "init_trackers was called again" in err and "log after end_training" in err
    run = read_run(path)
    assert run.series["loss"] == [(0, 1.0), (1, 0.5), (2, 1 / 3), (3, 0.1)] and run.finished
    assert run.config["lr"] == 0.1 and "note" not in run.series


def test_two_runs_in_one_second_get_two_files(tmp_path):
    paths = []
    for _ in range(2):
        trackers = Trackers("jsonl", accelerator(tmp_path))
        trackers.init("same")
        paths.append(trackers.get("jsonl", unwrap=True))
        trackers.finish()
    assert paths[0] != paths[1] and all(p.exists() for p in paths)


def test_a_partial_last_line_is_ignored_and_a_bad_line_is_named(tmp_path):
    trackers = Trackers("jsonl", accelerator(tmp_path))
    trackers.init("p")
    trackers.log({"loss": 1.0}, step=1)
    path = trackers.get("jsonl", unwrap=True)
    trackers.finish()
    with open(path, "a") as fp:
        fp.write('{"event": "log", "st')  # killed mid-line
    assert read_run(path).series == {"loss": [(1, 1.0)]}
    path.write_text(path.read_text().replace('{"event": "log", "st', 'garbage\n{"event":"finish"}'))
    with pytest.raises(ValueError, match=rf"{path.name}:4: not a JSON line"):
        read_run(path)


def test_log_lines_reach_the_file_at_most_flush_secs_apart(tmp_path):
    slow = Trackers("jsonl", accelerator(tmp_path))
    slow.init("slow", init_kwargs={"jsonl": {"flush_secs": 3600}})
    eager = Trackers("jsonl", accelerator(tmp_path))
    eager.init("eager", init_kwargs={"jsonl": {"flush_secs": 0}})
    for trackers in (slow, eager):
        trackers.log({"loss": 1.0}, step=0)
        trackers.log({"loss": float("nan"), "note": "diverged"}, step=1)
    slow_path, eager_path = (t.get("jsonl", unwrap=True) for t in (slow, eager))
    assert [r["event"] for r in records(slow_path)] == ["run"]  # kept until the next flush
    assert [r.get("step") for r in records(eager_path)] == [None, 0, 1]
    slow.finish()
    logged = records(slow_path)
    assert [r.get("step") for r in logged] == [None, 0, 1, None] and math.isnan(logged[2]["values"]["loss"])
    assert logged[2]["values"]["note"] == "diverged"


# ------------------------------------------------------------------------------------------- processes, failures
def test_other_processes_get_no_trackers_unless_a_tracker_asks_for_every_process(tmp_path):
    everywhere, main_only = Recorder("e", main_process_only=False), Recorder("m")
    main_only.name = "main_only"
    trackers = Trackers(["jsonl", everywhere, main_only], accelerator(tmp_path, main=False))
    trackers.init("p", config={"a": 1})
    trackers.log({"loss": 1.0}, step=0)
    trackers.finish()
    assert trackers.trackers == [everywhere] and main_only.calls == []
    assert everywhere.calls == [("start",), ("config", {"a": 1}), ("log", {"loss": 1.0}, 0, {}), ("finish",)]
    assert not (tmp_path / "project").exists()  # the jsonl run exists on the main process only
    none = Trackers(["jsonl"], accelerator(tmp_path, main=False))
    none.init("p")
    assert none.trackers == [] and isinstance(none.get("jsonl"), GeneralTracker)


def test_log_kwargs_and_init_kwargs_reach_their_tracker_only(tmp_path, capsys):
    mine = Recorder()
    trackers = Trackers(["jsonl", mine], accelerator(tmp_path))
    trackers.init("p", init_kwargs={"recorder": {}, "wandb": {"entity": "x"}})
    trackers.log({"loss": 1.0}, step=3, log_kwargs={"recorder": {"commit": False}})
    assert mine.calls[-1] == ("log", {"loss": 1.0}, 3, {"commit": False})
    assert "init_kwargs={'wandb': ...}): no tracker 'wandb' is chosen" in capsys.readouterr().err
    with pytest.raises(TypeError, match="values must be a dict of name -> value, got list"):
        trackers.log([1.0])


def test_a_tracker_that_fails_is_named_switched_off_and_the_others_go_on(tmp_path, capsys):
    broken_log, broken_start, good = Recorder(fail_in="log"), Recorder(fail_in="start"), Recorder()
    broken_log.name, broken_start.name, good.name = "broken_log", "broken_start", "good"
    trackers = Trackers(["jsonl", broken_start, broken_log, good], accelerator(tmp_path))
    trackers.init("p")
    for step in range(3):
        trackers.log({"loss": float(step)}, step=step)  # never raises
    trackers.finish()
    err = capsys.readouterr().err
    assert "tracker 'broken_start' failed in start: RuntimeError: the library broke in start (at " \
           "test_tracking.py:" in err and "switched off for the rest of this run (training continues" in err
    assert err.count("tracker 'broken_log' failed in log") == 1
    assert [t.name for t in trackers.trackers] == ["jsonl", "good"]
    assert [c[2] for c in good.calls if c[0] == "log"] == [0, 1, 2]
    assert isinstance(trackers.get("broken_log"), GeneralTracker) and "failed earlier" in capsys.readouterr().err
    with pytest.raises(ValueError, match="nope is not an available tracker stored inside the `Accelerator`"):
        trackers.get("nope")


def test_an_unwritable_logging_directory_is_a_message_naming_the_tracker(tmp_path, capsys):
    (tmp_path / "project").write_text("a file where the directory should be")
    mine = Recorder()
    trackers = Trackers(["jsonl", mine], accelerator(tmp_path))
    trackers.init("p")
    trackers.log({"loss": 1.0}, step=0)
    err = capsys.readouterr().err
    assert "acc: tracker 'jsonl' failed in start: NotADirectoryError" in err and str(tmp_path / "project") in err
    assert trackers.trackers == [mine] and mine.calls[-1][0] == "log"
