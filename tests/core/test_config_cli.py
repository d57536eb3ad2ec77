"""`acc config` and backend detection: questionnaire, default, show, detection faked, stale configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from acc.cli import cli


def invoke(*args: str, input: str | None = None, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=False, prog_name="acc")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("")
    return path


def user_file(tmp_path: Path) -> Path:
    return tmp_path / "user-config" / "config.toml"


def setting_line(output: str, name: str) -> list[str]:
    """The `name value source...` row of the settings table (after the plan rows, which share some names)."""
    table = output.split("settings (value, then where it came from):", 1)[1]
    return next(ln.split() for ln in table.splitlines() if ln.split() and ln.split()[0] == name)


@pytest.mark.parametrize("answers,expected", [
    # backend, nproc, precision, machines [, backend questions...]
    ("cpu\n1\nno\n1\n", {"backend": "cpu", "nproc": "1"}),
    ("ddp\n2\nbf16\n1\n", {"backend": "ddp", "nproc": "2", "mixed_precision": "bf16"}),
    ("deepspeed\n2\nno\n1\n3\ncpu\nnone\n0.5\n\n",
     {"backend": "deepspeed", "zero_stage": "3", "offload_optimizer": "cpu", "gradient_clipping": "0.5"}),
])
def test_questionnaire_writes_the_user_file_that_launch_reads(tmp_path, script, answers, expected):
    result = invoke("config", input=answers)
    assert result.exit_code == 0, result.output
    assert user_file(tmp_path).is_file()
    dry = invoke("launch", "--dry-run", str(script))
    assert dry.exit_code == 0, dry.output
    for name, value in expected.items():
        line = setting_line(dry.output, name)
        assert line[1] == value and " ".join(line[2:]) == f"user file {user_file(tmp_path)}", line


def test_questionnaire_asks_only_the_chosen_backends_questions(tmp_path):
    result = invoke("config", input="ddp\n2\nno\n1\n")
    assert result.exit_code == 0 and "ZeRO stage" not in result.output and "shard" not in result.output
    result = invoke("config", "--project", input="fsdp\n2\nno\n1\ntransformer_layer=Block\nfull_shard\nn\n")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "acc.toml").read_text()
    assert '[fsdp]\nfsdp_wrap = "transformer_layer=Block"' in text and "ZeRO" not in result.output


def test_questionnaire_re_asks_a_bad_answer(tmp_path):
    result = invoke("config", input="cpu\ntwo\n1\nno\n1\n")
    assert result.exit_code == 0 and "expected an integer >= 1, got 'two'" in result.output


def test_questionnaire_refuses_to_write_what_launch_would_refuse(tmp_path):
    result = invoke("config", input="cpu\n2\nno\n1\n")
    assert result.exit_code == 2 and "backend 'cpu' runs a single process" in result.output
    assert not user_file(tmp_path).exists()


def test_config_default_and_show(tmp_path, script):
    result = invoke("config", "default", env={"ACC_HARDWARE": '{"cuda": 2}'})
    assert result.exit_code == 0 and "2 CUDA devices found" in result.output
    text = user_file(tmp_path).read_text()
    assert 'backend = "ddp"' in text and "nproc = 2" in text
    shown = invoke("config", "show", env={"ACC_HARDWARE": '{"cuda": 2}', "ACC_MIXED_PRECISION": "bf16"})
    assert setting_line(shown.output, "backend")[1:3] == ["ddp", "user"]
    assert setting_line(shown.output, "mixed_precision")[1:] == ["bf16", "env", "ACC_MIXED_PRECISION"]
    assert setting_line(shown.output, "max_restarts")[1:] == ["0", "default"]


@pytest.mark.parametrize("hardware,backend,nproc,why", [
    ('{"cuda": 2}', "ddp", "2", "2 CUDA devices found"),
    ('{"mps": true}', "mps", "1", "an Apple Silicon GPU (MPS) found"),
    ('{}', "cpu", "1", "no accelerator that another installed backend uses"),
])
def test_detection_picks_the_backend_and_says_why(script, hardware, backend, nproc, why):
    result = invoke("launch", "--dry-run", str(script), env={"ACC_HARDWARE": hardware})
    assert result.exit_code == 0, result.output
    assert f"detected: {why}" in result.output
    assert setting_line(result.output, "backend")[1:] == [backend, "detected"]
    assert setting_line(result.output, "nproc")[1:] == [nproc, "detected"]


def test_detection_names_a_better_backend_that_is_not_installed(script):
    result = invoke("launch", "--dry-run", str(script), env={"ACC_HARDWARE": '{"tpu": 4}'})
    assert result.exit_code == 0
    assert "4 TPU chips found; acc-xla is not installed (pip install acc-xla); running 1 process with the cpu" \
        in result.output


def test_an_explicit_choice_is_not_overridden_by_detection(script):
    result = invoke("launch", "--backend", "cpu", "--dry-run", str(script), env={"ACC_HARDWARE": '{"cuda": 4}'})
    assert setting_line(result.output, "backend")[1:] == ["cpu", "flag", "--backend"] and "detected:" not in result.output


def test_a_config_from_another_machine_naming_a_missing_backend(tmp_path, script):
    user_file(tmp_path).parent.mkdir(parents=True)
    user_file(tmp_path).write_text('backend = "xla"\n')
    result = invoke("launch", "--dry-run", str(script))
    assert result.exit_code == 2
    assert "backend 'xla' is not installed" in result.output and "pip install acc-xla" in result.output
    assert f"(backend from user file {user_file(tmp_path)})" in result.output


def test_a_config_asking_for_more_processes_than_devices(tmp_path, script):
    user_file(tmp_path).parent.mkdir(parents=True)
    user_file(tmp_path).write_text('backend = "ddp"\nnproc = 8\n')
    result = invoke("launch", "--dry-run", str(script), env={"ACC_HARDWARE": '{"cuda": 2}'})
    assert result.exit_code == 2
    assert f"nproc = 8 (from user file {user_file(tmp_path)}) but only 2 CUDA device(s) are visible" in result.output
    assert "use --nproc 2" in result.output


def test_bad_hardware_override_is_a_clear_error(script):
    result = invoke("launch", "--dry-run", str(script), env={"ACC_HARDWARE": "two gpus"})
    assert result.exit_code == 2 and "ACC_HARDWARE='two gpus' is not a JSON object" in result.output
