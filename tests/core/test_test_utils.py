"""acc.test_utils, Accelerate's test_utils for acc: every name Accelerate's tests import is there, the skip
decorators skip exactly where they should on this machine, the helpers behave as Accelerate's (launch command,
package paths, subprocesses, exceptions, the regression problem, compare_against_test), and acc's versions of
Accelerate's test scripts pass on 1 process and (slow) on 2 real ones, and fail when a check fails.

Where a script finds a known gap of acc (an Accelerate behaviour acc does not have yet), its test says so as an
xfail naming the gap, and fails for any other failure: a script that stops failing simply passes.
"""

from __future__ import annotations

import subprocess
import sys
import unittest
from pathlib import Path

import pytest
import torch

import acc
from acc.test_utils import testing
from tests.conftest import ACC, clean_env

SCRIPTS = Path(acc.__file__).parent / "test_utils" / "scripts"

# Accelerate 1.15's tests import these (tests/test_*.py, `from accelerate.test_utils[.testing] import ...`)
FROM_PACKAGE = [
    "DEFAULT_LAUNCH_COMMAND", "assert_exception", "device_count", "execute_subprocess_async", "get_launch_command",
    "get_torch_dist_unique_port", "memory_allocated_func", "path_in_accelerate_package", "require_bnb", "require_cpu",
    "require_cuda", "require_cuda_or_hpu", "require_cuda_or_xpu", "require_fp16", "require_fp8",
    "require_huggingface_suite", "require_multi_device", "require_multi_gpu_or_xpu", "require_non_cpu",
    "require_non_hpu", "require_non_torch_xla", "require_pippy", "require_single_device", "require_torchao",
    "require_torchvision", "require_tpu", "require_transformer_engine", "require_transformer_engine_mxfp8",
    "run_first", "slow", "torch_device", "RegressionDataset", "RegressionModel", "test_ops", "test_script",
    "test_sync",
]
FROM_TESTING = [
    "AccelerateTestCase", "MockingTestCase", "TempDirTestCase", "assert_exception", "capture_call_output",
    "get_launch_command", "is_hpu_available", "is_xpu_available", "path_in_accelerate_package", "require_aim",
    "require_clearml", "require_comet_ml", "require_cuda", "require_datasets", "require_deepspeed", "require_dvclive",
    "require_fp16", "require_huggingface_suite", "require_import_timer", "require_matplotlib", "require_mlflow",
    "require_multi_device", "require_non_cpu", "require_non_hpu", "require_non_torch_xla", "require_pandas",
    "require_pippy", "require_schedulefree", "require_swanlab", "require_tensorboard", "require_timm",
    "require_torch_min_version", "require_torchdata_stateful_dataloader", "require_tpu", "require_trackers",
    "require_trackio", "require_transformers", "require_triton", "require_wandb", "run_command", "run_first", "skip",
    "slow", "torch_device",
]


def test_every_name_accelerates_tests_import_is_there():
    import acc.test_utils as package
    from acc.test_utils.examples import compare_against_test
    from acc.test_utils.scripts.external_deps import test_metrics
    from acc.test_utils.training import mocked_dataloaders

    missing = [f"acc.test_utils.{n}" for n in FROM_PACKAGE if not hasattr(package, n)]
    missing += [f"acc.test_utils.testing.{n}" for n in FROM_TESTING if not hasattr(testing, n)]
    assert not missing, missing
    assert callable(compare_against_test) and callable(mocked_dataloaders) and callable(test_metrics.main)
    for name in ("test_script", "test_sync", "test_ops"):
        assert callable(getattr(package, name).main)


# ---------------------------------------------------------------------------------------------- decorators


def _skipped(decorator, target=None) -> bool:
    decorated = decorator(target or (lambda: None))
    return bool(getattr(decorated, "__unittest_skip__", False))


def test_the_device_is_the_cpu_here():
    assert (testing.torch_device, testing.device_count, testing.memory_allocated_func()) == ("cpu", 1, 0)


@pytest.mark.parametrize("decorator,skips", [
    ("require_cpu", False), ("require_non_cpu", True), ("require_cuda", True), ("require_cuda_or_hpu", True),
    ("require_cuda_or_xpu", True), ("require_xpu", True), ("require_mps", True), ("require_tpu", True),
    ("require_non_torch_xla", False), ("require_non_hpu", False), ("require_non_xpu", False),
    ("require_single_device", True), ("require_multi_device", True), ("require_multi_gpu", True),
    ("require_multi_gpu_or_xpu", True), ("require_single_gpu", True), ("require_fp16", False),
    ("require_fp8", True), ("require_fsdp2", False), ("require_pippy", False), ("require_transformer_engine", True),
    ("require_transformer_engine_mxfp8", True), ("require_deepspeed", False), ("require_datasets", True),
    ("require_huggingface_suite", True), ("skip", True),
])
def test_a_decorator_skips_exactly_where_its_condition_fails_here(decorator, skips):
    # torch's CPU build, no torch_xla, deepspeed installed, datasets not: what this machine's venv holds
    assert not torch.cuda.is_available()
    assert _skipped(getattr(testing, decorator)) is skips


def test_package_decorators_follow_acc_s_is_available_checks():
    from acc.utils import imports

    for name in ("aim", "clearml", "comet_ml", "dvclive", "mlflow", "pandas", "schedulefree", "swanlab",
                 "tensorboard", "timm", "torchvision", "triton", "wandb", "trackio", "matplotlib", "bnb", "torchao",
                 "transformers", "peft", "torchdata_stateful_dataloader"):
        present = getattr(imports, f"is_{name}_available")()
        assert _skipped(getattr(testing, f"require_{name}")) is not present, name


def test_a_decorated_test_case_class_is_skipped_whole():
    @testing.require_non_cpu
    class NeedsAGpu(unittest.TestCase):
        def test_it(self):
            raise AssertionError("ran")

    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(NeedsAGpu).run(result)
    assert (result.testsRun, len(result.skipped), result.failures) == (1, 1, [])


def test_slow_and_torch_min_version(monkeypatch):
    monkeypatch.setattr(testing, "_run_slow_tests", False)
    assert _skipped(testing.slow)
    monkeypatch.setattr(testing, "_run_slow_tests", True)
    assert not _skipped(testing.slow)
    assert not _skipped(testing.require_torch_min_version(version="2.0"))
    assert _skipped(testing.require_torch_min_version(version="99.0"))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # pytest-order is not installed here
def test_run_first_orders_the_test_first():
    def test_something():
        pass

    marked = testing.run_first(test_something)
    assert [m.args for m in marked.pytestmark if m.name == "order"] == [(1,)]


# ---------------------------------------------------------------------------------------------- helpers


def test_path_in_accelerate_package_points_into_the_installed_acc():
    import acc.test_utils.scripts.test_script as script

    path = testing.path_in_accelerate_package("test_utils", "scripts", "test_script.py")
    assert path == Path(script.__file__).resolve() and path.is_file()
    assert path.is_relative_to(Path(acc.__file__).resolve().parent)


def test_get_launch_command_writes_accelerates_flags_for_acc_launch():
    command = testing.get_launch_command(num_processes=2, monitor_interval=0.1, multi_gpu=True, mixed_precision=None,
                                         tee=0)
    assert command == [ACC, "launch", "--num_processes=2", "--monitor_interval=0.1", "--multi_gpu", "--tee=0"]
    assert testing.DEFAULT_LAUNCH_COMMAND == [ACC, "launch", "--num_processes=1", "--monitor_interval=0.1"]


def test_the_default_launch_command_runs_a_script(tmp_path, capsys):
    script = tmp_path / "hello.py"
    script.write_text("from acc.state import PartialState\nprint('processes', PartialState().num_processes)\n")
    result = testing.execute_subprocess_async(testing.DEFAULT_LAUNCH_COMMAND + [script], env=clean_env(tmp_path),
                                              timeout=120)
    assert "processes 1" in result.stdout
    assert "stdout: processes 1" in capsys.readouterr().out


@pytest.mark.slow
def test_a_launch_command_with_accelerates_flags_runs_two_processes(tmp_path):
    for flags in ({"num_processes": 2, "monitor_interval": 0.1}, {"multi_gpu": True, "num_processes": 2}):
        command = testing.get_launch_command(**flags) + [SCRIPTS / "test_ops.py"]
        result = testing.execute_subprocess_async(command, env=clean_env(tmp_path), quiet=True, timeout=300)
        assert "Num processes: 2" in result.stdout, flags


def test_execute_subprocess_async_and_run_command_report_failures(tmp_path):
    fail = [sys.executable, "-c", "import sys; print('out'); sys.exit('boom')"]
    with pytest.raises(RuntimeError, match=r"failed with returncode 1[\s\S]*boom"):
        testing.execute_subprocess_async(list(fail), quiet=True)
    with pytest.raises(testing.SubprocessCallException, match="boom"):
        testing.run_command(list(fail))
    assert testing.run_command([sys.executable, "-c", "print('hi')"], return_stdout=True) == "hi\n"
    with pytest.raises(RuntimeError, match="did not finish within"):
        testing.execute_subprocess_async([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1, quiet=True)


def test_assert_exception_and_capture_call_output():
    with testing.assert_exception(ValueError, "bad"):
        raise ValueError("a bad value")
    for body, message in ((lambda: None, "ran without issue"), (lambda: 1 / 0, "Expected exception of type"),
                          (lambda: (_ for _ in ()).throw(ValueError("other")), "to be in exception")):
        with pytest.raises(AssertionError, match=message):
            with testing.assert_exception(ValueError, "bad"):
                body()
    assert testing.capture_call_output(print, "a", "b") == "a b\n"


def test_the_xdist_port(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert (testing.pytest_xdist_worker_id(), testing.get_torch_dist_unique_port()) == (3, 29503)
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert testing.get_torch_dist_unique_port() == 29500


def test_test_cases_reset_acc_and_empty_their_directory():
    from acc.runtime import worker
    from acc.state import PartialState

    class Case(testing.AccelerateTestCase, testing.TempDirTestCase):
        def check(self):
            assert worker.current() is None, "the previous test's run is still current"
            assert not any(self.tmpdir.iterdir()), "the directory was not emptied"
            (self.tmpdir / "sub").mkdir()
            (self.tmpdir / "sub" / "f").write_text("x")
            (self.tmpdir / "g").write_text("y")
            PartialState()
            assert worker.current() is not None

        test_a = test_b = check

    testing.reset_state()  # a run an earlier test in this session left current (AccelerateTestCase resets after)
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(Case).run(result)
    assert (result.testsRun, result.errors, result.failures) == (2, [], [])
    assert worker.current() is None and not Case.tmpdir.exists()


def test_mocking_test_case_stops_its_mocks():
    import os
    from unittest import mock

    class Case(testing.MockingTestCase):
        def setUp(self):
            super().setUp()
            self.add_mocks(mock.patch.dict(os.environ, {"ACC_TEST_UTILS_MOCK": "1"}))

        def test_it(self):
            assert os.environ["ACC_TEST_UTILS_MOCK"] == "1"

    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(Case).run(result)
    assert (result.testsRun, result.failures) == (1, []) and "ACC_TEST_UTILS_MOCK" not in os.environ


def test_the_regression_problem_trains():
    import numpy as np

    from acc.test_utils import RegressionDataset, RegressionModel

    data = RegressionDataset(a=2, b=3, length=64, seed=42)
    rng = np.random.default_rng(42)
    x = rng.normal(size=(64,)).astype(np.float32)
    assert len(data) == 64 and np.array_equal(data.x, x) and data[5]["x"] == x[5]
    np.testing.assert_allclose(data.y, 2 * x + 3, atol=0.5)
    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    for _ in range(30):
        for batch in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(batch["x"]), batch["y"]).backward()
            optimizer.step()
    assert abs(model.a.item() - 2) < 0.1 and abs(model.b.item() - 3) < 0.1


def test_compare_against_test(tmp_path, monkeypatch):
    from acc.test_utils.examples import compare_against_test

    def example(*body: str, main_extra: str = "") -> str:
        lines = "".join(f"    {line}\n" for line in body)
        return (f"import x\n\n\ndef training_function(config, args):\n{lines}\n    # a comment\n\n"
                f"def main():\n    parser = 1\n{main_extra}\n\nif __name__ == '__main__':\n    main()\n")

    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").mkdir()
    base = ["accelerator = Accelerator()", "train_dataloader, eval_dataloader = get_dataloaders(accelerator, "
            "batch_size)", "model = make()"]
    (tmp_path / "examples" / "nlp_example.py").write_text(example(*base))
    feature = example(*base, "if os.environ.get('TESTING_MOCKED_DATALOADERS', None) == '1':",
                      "    config['num_epochs'] = 2", "accelerator.save_state(out)", "tracker.log(1)", "last()")
    (tmp_path / "feature.py").write_text(feature)
    (tmp_path / "complete.py").write_text(example(*base, "accelerator.save_state(out)"))
    # missing: tracker.log and last(); the template's lines, the marker and the line after it are not counted
    missing = compare_against_test("complete.py", "feature.py", parser_only=False)
    assert missing == ["    tracker.log(1)\n", "    last()\n"]
    # without a marker, the feature's last line is not examined (as in Accelerate)
    (tmp_path / "feature.py").write_text(example(*base, "tracker.log(1)", "last()"))
    assert compare_against_test("complete.py", "feature.py", parser_only=False) == ["    tracker.log(1)\n"]
    assert compare_against_test("feature.py", "feature.py", parser_only=False) == []
    (tmp_path / "parser.py").write_text(example(*base, main_extra="    parser.add('--x')\n    done()"))
    assert compare_against_test("complete.py", "parser.py", parser_only=True) == ["    parser.add('--x')\n"]


# ---------------------------------------------------------------------------------------------- the scripts

# Accelerate behaviours acc does not have yet, which a script finds, are listed per script below by the message
# of the failing check (none today): the test is then an xfail naming them, and fails on any other failure


def _run_script(tmp_path: Path, script: str, nproc: int | None, backend: str = "ddp", timeout: float = 600,
                **env: str) -> subprocess.CompletedProcess:
    path = str(SCRIPTS / script)
    if nproc is None:
        cmd = [sys.executable, path]
    else:
        cmd = [ACC, "launch", "--backend", backend, "--nproc", str(nproc), "--output-dir", "", path]
    return subprocess.run(cmd, cwd=tmp_path, env=clean_env(tmp_path, **env), capture_output=True, text=True,
                          timeout=timeout)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _failed_checks(output: str) -> list[str]:
    """The failing checks a script reported (the last AssertionError, e.g. in `acc launch`'s report): its message,
    or the titles listed under 'failed checks:'."""
    lines = output.splitlines()
    hits = [i for i, line in enumerate(lines) if "AssertionError: " in line]
    if not hits:
        return []
    head = lines[hits[-1]]
    message = head.split("AssertionError: ", 1)[1].strip()
    if not message.startswith("failed checks:"):
        return [message]
    titles = set()
    for line in lines[hits[-1] + 1:]:
        if not line.strip() or _indent(line) <= _indent(head) or line.strip().startswith("("):
            break
        titles.add(line.strip().split(": ")[0])
    return sorted(titles)


def _expect(proc: subprocess.CompletedProcess, known_gaps: tuple[str, ...] = ()) -> None:
    """Passed; or failed on known gaps only (then xfail, naming them)."""
    output = proc.stdout + proc.stderr
    if proc.returncode == 0:
        return
    failed = _failed_checks(output)
    unknown = [f for f in failed if not any(f.startswith(g) for g in known_gaps)]
    assert failed and not unknown, f"exit code {proc.returncode}; failed: {failed}\n{output[-6000:]}"
    pytest.xfail(f"acc gaps the script finds: {failed}")


@pytest.mark.parametrize("script,gaps", [
    ("test_script.py", ()), ("test_sync.py", ()), ("test_ops.py", ()),
    ("external_deps/test_metrics.py", ()), ("test_ddp_comm_hook.py", ()), ("test_cli.py", ()),
    ("test_distributed_data_loop.py", ()), ("test_notebook.py", ()),
])
def test_a_script_passes_on_one_process(tmp_path, script, gaps):
    _expect(_run_script(tmp_path, script, None), gaps)


@pytest.mark.slow
@pytest.mark.parametrize("script,gaps", [
    ("test_script.py", ()), ("test_sync.py", ()), ("test_ops.py", ()),
    ("external_deps/test_metrics.py", ()), ("test_ddp_comm_hook.py", ()), ("test_cli.py", ()),
    ("test_distributed_data_loop.py", ()),
])
def test_a_script_passes_on_two_processes(tmp_path, script, gaps):
    _expect(_run_script(tmp_path, script, 2), gaps)


@pytest.mark.slow
def test_the_notebook_script_passes_with_two_processes(tmp_path):
    proc = _run_script(tmp_path, "test_notebook.py", None, ACCELERATE_NUM_PROCESSES="2")
    assert "Test monitoring" in proc.stdout, proc.stdout + proc.stderr
    _expect(proc)


@pytest.mark.slow
def test_the_merge_weights_script_passes_on_two_fsdp_processes(tmp_path):
    proc = _run_script(tmp_path, "test_merge_weights.py", 2, backend="fsdp")
    assert "Testing test_merge_weights_pytorch" in proc.stdout, proc.stdout + proc.stderr
    _expect(proc)


def test_the_merge_weights_script_says_it_checked_nothing_on_one_process(tmp_path):
    proc = _run_script(tmp_path, "test_merge_weights.py", None)
    assert proc.returncode == 0 and "nothing checked" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_pippy_script_checks_pipeline_inference_on_three_processes(tmp_path):
    """prepare_pippy on gloo: the last process's output (every process's with gather_output) equals the unsplit
    model's within 1e-6, for "auto" and explicit split points and a batch padded to the micro-batches. Not bitwise:
    a micro-batch's matmuls may round differently from the whole batch's (exact on one machine, 2.4e-7 apart on
    another, with the same torch)."""
    proc = _run_script(tmp_path, "external_deps/test_pippy.py", 3, **{"ACC_TEE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "test_pippy" in line]
    differences = [float(line.split("max |difference| ")[1].split()[0]) for line in lines]
    assert len(lines) == 7 and max(differences) <= 1e-6, proc.stdout


@pytest.mark.slow
def test_debug_launcher_runs_the_scripts_main_functions():
    """What Accelerate's test_cpu.py and test_grad_sync.py do: debug_launcher(module.main)."""
    from acc import debug_launcher
    from acc.test_utils import test_ops, test_sync

    debug_launcher(test_ops.main)
    debug_launcher(test_sync.main, num_processes=1)


def test_a_script_fails_when_acc_gives_a_wrong_result(tmp_path):
    """The checks are real: a gather that drops a value fails test_ops."""
    wrapper = tmp_path / "broken.py"
    wrapper.write_text(
        "import acc.test_utils.scripts.test_ops as ops\n"
        "real = ops.gather\n"
        "ops.gather = lambda t: real(t)[:-1]\n"
        "ops.main()\n")
    proc = subprocess.run([sys.executable, str(wrapper)], cwd=tmp_path, env=clean_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and "gather gave" in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_script_fails_when_no_sync_synchronises(tmp_path):
    """On two processes, a no_sync that lets DDP synchronise fails test_sync (exit code of `acc launch`)."""
    wrapper = tmp_path / "broken.py"
    wrapper.write_text(
        "import contextlib\n"
        "import acc.test_utils.scripts.test_sync as sync\n"
        "from acc import Accelerator\n"
        "Accelerator.no_sync = lambda self, model: contextlib.nullcontext()\n"
        "sync.main()\n")
    proc = subprocess.run([ACC, "launch", "--backend", "ddp", "--nproc", "2", "--output-dir", "", str(wrapper)],
                          cwd=tmp_path, env=clean_env(tmp_path), capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Gradients in sync when they should not be" in output, output
