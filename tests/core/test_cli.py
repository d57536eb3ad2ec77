"""The `acc` CLI: help, version, plugins, env, launch --dry-run, and every bad input (message + exit code)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from acc import __version__
from acc.cli import cli
from tests.conftest import ACC, run


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False, prog_name="acc")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('trained')\n")
    return path


def test_help_lists_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("launch", "plugins", "env"):
        assert command in result.output


def test_launch_help_lists_kernel_settings_as_flags():
    result = invoke("launch", "--help")
    assert result.exit_code == 0, result.output
    for flag in ("--backend", "--nproc", "--mixed-precision", "--num-machines", "--dry-run", "env ACC_NPROC"):
        assert flag in result.output


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"acc {__version__} (acc-core)"


def test_plugins_lists_the_builtin_backend_with_hooks_and_requirements():
    result = invoke("plugins")
    assert result.exit_code == 0, result.output
    assert "cpu  (acc-core" in result.output and "builtin default" in result.output
    assert "torch (importable)" in result.output and "launch_plan" in result.output
    rows = json.loads(invoke("plugins", "--json").output)
    cpu = next(r for r in rows if r["name"] == "cpu")
    assert cpu["requires"] == {"torch": True} and "acc_setup" in cpu["hooks"] and cpu["hookspec_version"] == 2
    assert "acc_communicator" in cpu["hooks"] and "acc_all_reduce" not in cpu["hooks"]


def test_dry_run_shows_plan_and_the_source_of_each_setting(script, tmp_path):
    (tmp_path / "acc.toml").write_text('mixed_precision = "bf16"\n')
    result = invoke("launch", "--dry-run", "--gradient-accumulation-steps", "4", str(script), "--lr", "1",
                    env={"ACC_CPU": "1"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "engine     process: one plain Python process" in out
    assert f"command    python {script} --lr 1" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and len(line.split()) >= 3}
    assert lines["gradient_accumulation_steps"].split()[1:] == ["4", "flag", "--gradient-accumulation-steps"]
    assert lines["cpu"].split()[1:] == ["True", "env", "ACC_CPU"]
    assert lines["mixed_precision"].split()[1:4] == ["bf16", "project", "file"]
    assert lines["nproc"].split()[1:] == ["1", "detected"]
    assert lines["backend"].split()[1:] == ["cpu", "detected"]
    assert "detected: no accelerator that another installed backend uses: running 1 process with the cpu backend" in out


def test_dry_run_of_a_module(tmp_path):
    (tmp_path / "mytrain.py").write_text("")
    result = invoke("launch", "--dry-run", "-m", "mytrain", "--epochs", "2")
    assert result.exit_code == 0, result.output
    assert "command    python -m mytrain --epochs 2" in result.output


# ---------------------------------------------------------------------------------------------- bad input


def test_unknown_backend(script):
    result = invoke("launch", "--backend", "fsdpx", str(script))
    assert result.exit_code == 2
    assert "Error: backend 'fsdpx' is not installed" in result.output and "installed: cpu" in result.output


def test_missing_script():
    result = invoke("launch", "nope.py")
    assert result.exit_code == 2
    assert "script 'nope.py' does not exist" in result.output and "give the path to a Python file" in result.output


def test_missing_module():
    result = invoke("launch", "-m", "no_such_module_xyz")
    assert result.exit_code == 2 and "module 'no_such_module_xyz' cannot be found" in result.output


def test_nproc_on_single_process_backend(script):
    result = invoke("launch", "--backend", "cpu", "--nproc", "2", str(script))
    assert result.exit_code == 2
    assert "backend 'cpu' runs a single process, but nproc = 2 (from flag --nproc)" in result.output
    assert "--backend ddp" in result.output


def test_bad_flag_value(script):
    result = invoke("launch", "--nproc", "two", str(script))
    assert result.exit_code == 2 and "flag --nproc: expected an integer >= 1, got 'two'" in result.output
    result = invoke("launch", "--mixed-precision", "fp8", str(script))
    assert result.exit_code == 2 and "'fp8' is not supported: acc has no fp8 mixed precision yet" in result.output
    assert "(expected one of: no, fp16, bf16)" in result.output
    result = invoke("launch", "--mixed-precision", "fp4", str(script))
    assert result.exit_code == 2 and "expected one of: no, fp16, bf16, got 'fp4'" in result.output


def test_static_rendezvous_without_a_port(script):
    result = invoke("launch", "--backend", "ddp", "--nproc", "2", "--rdzv-backend", "static", str(script))
    assert result.exit_code == 2 and "rdzv_backend 'static' (from flag --rdzv-backend) needs a known port on machine 0" in result.output


def test_unknown_flag(script):
    result = invoke("launch", "--nprocs", "2", str(script))
    assert result.exit_code == 2 and "No such option '--nprocs'" in result.output and "'--nproc'" in result.output


@pytest.mark.parametrize("flags,owner", [(["--fsdp-strategy", "full"], "fsdp"), (["--no-fsdp-cpu-offload"], "fsdp"),
                                         (["--backend", "ddp", "--zero-stage", "3"], "deepspeed")])
def test_a_flag_of_a_backend_not_chosen_names_its_backend(script, flags, owner):
    result = invoke("launch", *flags, "--dry-run", str(script))
    assert result.exit_code == 2 and "No such option" not in result.output, result.output
    assert f"is a setting of the {owner} backend" in result.output or f"sets the {owner} backend's" in result.output
    assert f"--backend {owner}" in result.output


def test_malformed_config_file(script, tmp_path):
    (tmp_path / "acc.toml").write_text('backend = "cpu"\nnproc = [\n')
    result = invoke("launch", str(script))
    assert result.exit_code == 2
    assert f"project file {tmp_path / 'acc.toml'}: not valid TOML" in result.output and "line" in result.output


def test_bad_key_value_in_config_file(script, tmp_path):
    (tmp_path / "acc.toml").write_text('backend = "cpu"\nmixed_precision = "fp32"\n')
    result = invoke("launch", str(script))
    assert result.exit_code == 2
    assert "line 2: key 'mixed_precision': expected one of: no, fp16, bf16, got 'fp32'" in result.output


def test_plugin_that_fails_to_import(script, tmp_path, monkeypatch):
    (tmp_path / "crashing_plugin.py").write_text("raise ImportError('needs libfoo 2.0')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("launch", "-p", "crashing_plugin", str(script))
    assert result.exit_code == 2
    assert "plugin 'crashing_plugin'" in result.output and "ImportError: needs libfoo 2.0" in result.output


def test_unknown_extra_plugin(script):
    result = invoke("launch", "-p", "timingg", str(script))
    assert result.exit_code == 2 and "plugin 'timingg' is neither an installed plugin nor an importable module" in result.output


def test_all_problems_are_reported_together(script):
    result = invoke("launch", "--backend", "cpu", "--nproc", "2", "--num-machines", "2", "--machine-rank", "3",
                    str(script))
    assert result.exit_code == 2
    assert "problem(s)" in result.output
    for fragment in ("machine_rank 3", "needs the address of machine 0", "runs a single process",
                     "runs on one machine"):
        assert fragment in result.output


# ---------------------------------------------------------------------------------------------- real processes


def _modules_after(argv: list[str]) -> list[str]:
    code = (
        "import sys\nfrom acc.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in ('torch', 'numpy', 'acc.accelerator', 'acc_ddp.plugin') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("LOADED")]
    assert line, proc.stdout + proc.stderr
    return eval(line[0][len("LOADED "):])


@pytest.mark.parametrize("argv", [["--help"], ["plugins"], ["launch", "--help"], ["--version"]])
def test_commands_do_not_import_torch(argv):
    assert "torch" not in _modules_after(argv)


def test_dry_run_does_not_import_torch(script):
    assert "torch" not in _modules_after(["launch", "--dry-run", str(script)])


def test_dry_run_of_ddp_does_not_import_torch(script):
    loaded = _modules_after(["launch", "--backend", "ddp", "--nproc", "2", "--dry-run", str(script)])
    assert "acc_ddp.plugin" in loaded and "torch" not in loaded


def test_cli_errors_as_a_real_process_have_no_traceback(tmp_path):
    proc = run([ACC, "launch", "--backend", "nope", "x.py"], tmp_path)
    assert proc.returncode == 2
    assert "backend 'nope' is not installed" in proc.stderr and "Traceback" not in proc.stderr


def test_env_reports_versions(tmp_path):
    proc = run([ACC, "env"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"acc-core               {__version__}" in proc.stdout
    import torch

    assert torch.__version__ in proc.stdout and "python" in proc.stdout


def test_acc_launch_runs_the_script_with_its_arguments(tmp_path):
    (tmp_path / "echo_args.py").write_text(
        "import json, os, sys\nprint(json.dumps({'argv': sys.argv[1:], 'launched': 'ACC_LAUNCH' in os.environ}))\n"
        "sys.exit(3)\n"
    )
    proc = run([ACC, "launch", "echo_args.py", "--x", "1", "--", "-y"], tmp_path)
    assert proc.returncode == 3, proc.stderr  # the script's own exit code
    assert json.loads(proc.stdout) == {"argv": ["--x", "1", "--", "-y"], "launched": True}
