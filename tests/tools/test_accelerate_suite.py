"""The Accelerate-suite lane rewrites Accelerate's tests by exactly its three rules (scripts/accelerate_suite.py)."""

from __future__ import annotations

import importlib.util

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("accelerate_suite", ROOT / "scripts" / "accelerate_suite.py")
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)


def test_imports_at_the_start_of_a_line_become_acc_ones():
    text = ("from accelerate import Accelerator\nimport accelerate.commands.env as env\n    from accelerate.utils import x\n"
            "import accelerated_lib\nx = 'from accelerate import y'\n")
    assert suite.rewrite(text) == ("from acc import Accelerator\nimport acc.commands.env as env\n    from acc.utils import x\n"
                                   "import accelerated_lib\nx = 'from accelerate import y'\n")


def test_patch_targets_and_logger_names_are_rewritten_only_on_patch_and_assert_logs_lines():
    text = ('@patch("accelerate.commands.env.which", return_value=None)\n'
            "with patch.object(x, 'accelerate.y'), patch.dict(\"accelerate.z\"):\n"
            'with self.assertLogs("accelerate.utils.environment", level="WARNING"):\n'
            'name = "accelerate.state"\n')
    assert suite.rewrite(text) == ('@patch("acc.commands.env.which", return_value=None)\n'
                                   "with patch.object(x, 'acc.y'), patch.dict(\"acc.z\"):\n"
                                   'with self.assertLogs("acc.utils.environment", level="WARNING"):\n'
                                   'name = "accelerate.state"\n')


def test_the_command_in_an_argument_list_becomes_acc():
    text = 'cmd = ["accelerate", "tpu-config"]\nrun(["accelerate"])\nversion("accelerate")\nx = ["accelerate-x"]\n'
    assert suite.rewrite(text) == 'cmd = ["acc", "tpu-config"]\nrun(["acc"])\nversion("accelerate")\nx = ["accelerate-x"]\n'


def test_the_per_file_table_counts_only_tests_that_pass_on_accelerate():
    base = {"tests.test_a.T::test_1": "passed", "tests.test_a.T::test_2": "passed", "tests.test_b::test_3": "failed"}
    acc = {"tests.test_a.T::test_1": "passed", "tests.test_a.T::test_2": "failed", "tests.test_b::test_3": "passed"}
    result = suite.summary(base, acc)
    assert (result["baseline_passed"], result["acc_passed"]) == (2, 1)
    assert result["per_file"] == {"tests/test_a.py": [2, 1]}


def test_the_table_lists_each_test_still_failing_with_its_cause():
    base = {"tests.test_a.T::test_x": "passed", "tests.test_a.T::test_y": "passed", "tests.test_a.T::test_z": "failed"}
    acc = {"tests.test_a.T::test_x": "passed", "tests.test_a.T::test_y": "failed"}
    result = suite.summary(base, acc)
    assert (result["acc_passed"], result["baseline_passed"]) == (1, 2)
    assert result["failing"] == {"tests.test_a.T::test_y": "cause not named yet"}
    assert "- `tests.test_a.T::test_y`: cause not named yet" in suite.table(result)


def test_the_table_counts_the_scripts_that_ran_to_the_end():
    result = suite.summary({"tests.test_a.T::test_x": "passed"}, {"tests.test_a.T::test_x": "passed"})
    result["scripts"] = {f"{name}@{n}": "passed" for name in suite.SCRIPTS for n in (1, 2)}
    result["scripts"]["test_ops.py@2"] = "failed: ImportError: cannot import name 'x'"
    text = suite.table(result)
    assert "**7 of 8** run to the end" in text
    assert "| test_ops.py | passed | failed: ImportError: cannot import name 'x' |" in text


def test_a_failed_test_is_tried_once_more_by_its_node_id(tmp_path):
    import sys

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import pathlib\n"
        "class TestThing:\n"
        "    def test_second_try(self):\n"
        "        mark = pathlib.Path(__file__).with_name('tried')\n"
        "        first = not mark.exists()\n"
        "        mark.touch()\n"
        "        assert not first\n"
        "def test_always_fails():\n"
        "    assert False\n")
    ids = ["tests.test_x.TestThing::test_second_try", "tests.test_x::test_always_fails"]
    assert [suite.node_id(t, tmp_path) for t in ids] == ["tests/test_x.py::TestThing::test_second_try",
                                                          "tests/test_x.py::test_always_fails"]
    assert suite.rerun(sys.executable, tmp_path, ids, 120) == {ids[0]: "failed", ids[1]: "failed"}  # first try
    assert suite.rerun(sys.executable, tmp_path, ids, 120) == {ids[0]: "passed", ids[1]: "failed"}


def test_the_baseline_is_kept_per_source_and_venv_and_measured_again_when_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "CACHE", tmp_path / "cache")
    archive = tmp_path / "accelerate-1.15.0.tar.gz"
    archive.write_bytes(b"sdist")
    runs = []

    def fake_run(python, where, label, timeout):  # stands in for pytest over Accelerate's tests (the slow part)
        runs.append(python)
        return {"tests.test_a::t": "passed", "tests.test_b::t": "failed"}

    monkeypatch.setattr(suite, "run", fake_run)
    monkeypatch.setattr(suite, "unpack_tests", lambda archive, into, transform: into)
    first = suite.baseline("/venv-a/bin/python", archive, tmp_path, 60, fresh=False)
    assert suite.baseline("/venv-a/bin/python", archive, tmp_path, 60, fresh=False) == first
    assert runs == ["/venv-a/bin/python"]  # the second call read the kept outcomes
    suite.baseline("/venv-b/bin/python", archive, tmp_path, 60, fresh=False)  # another venv: measured
    suite.baseline("/venv-a/bin/python", archive, tmp_path, 60, fresh=True)  # asked for: measured again
    archive.write_bytes(b"another sdist")
    suite.baseline("/venv-a/bin/python", archive, tmp_path, 60, fresh=False)  # another source: measured
    assert runs == ["/venv-a/bin/python", "/venv-b/bin/python", "/venv-a/bin/python", "/venv-a/bin/python"]


def _archive(tmp_path):
    """A source distribution holding the four scripts (each prints its name)."""
    import io
    import tarfile

    archive = tmp_path / "accelerate.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in suite.SCRIPTS:
            data = f"print({name!r})\n".encode()
            info = tarfile.TarInfo(f"accelerate-{suite.VERSION}/src/accelerate/test_utils/scripts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def test_a_script_that_fails_once_gets_a_second_try_and_its_failure_report_is_printed(tmp_path, capsys):
    # a stand-in for `python -m acc launch ...`: test_sync.py on 2 processes fails the first time, with the report
    # acc launch prints; every other launch passes
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n"
                      'for last; do :; done\n'
                      'case "$*" in *--nproc\\ 2*test_sync.py*)\n'
                      f'  if [ ! -e {tmp_path}/tried ]; then touch {tmp_path}/tried\n'
                      '    echo "training..."; echo "acc launch: rank 0 (local rank 0) failed first: exit code 1" >&2\n'
                      '    echo "AssertionError: grads differ" >&2\n'
                      '    echo "rank 1 (local rank 1), also failed: Connection closed by peer" >&2; exit 1; fi;;\n'
                      "esac\n"
                      'echo "ran $last"\n')
    python.chmod(0o755)
    outcomes = suite.run_scripts(str(python), _archive(tmp_path), tmp_path / "scripts", timeout=60)
    assert outcomes["test_sync.py@2"] == "passed on a second try"
    assert all(o == "passed" for k, o in outcomes.items() if k != "test_sync.py@2")
    err = capsys.readouterr().err
    assert "acc launch: rank 0 (local rank 0) failed first: exit code 1\n  AssertionError: grads differ" in err
    result = suite.summary({"tests.test_a.T::test_x": "passed"}, {"tests.test_a.T::test_x": "passed"})
    result["scripts"] = outcomes
    assert "**8 of 8** run to the end" in suite.table(result)


def test_a_script_that_fails_twice_is_failed_with_its_last_line(tmp_path, capsys):
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\ncase "$*" in *--cpu*test_ops.py*) echo "ImportError: no x" >&2; exit 1;; esac\n')
    python.chmod(0o755)
    outcomes = suite.run_scripts(str(python), _archive(tmp_path), tmp_path / "scripts", timeout=60)
    assert outcomes["test_ops.py@1"] == "failed: ImportError: no x"
    assert capsys.readouterr().err.count("script test_ops.py on 1 process(es): FAILED") == 2
