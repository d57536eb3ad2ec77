"""The redaction rule (acc.assembly.redact): which names look like credentials, how command lines, settings, environments
and hyper-parameters are redacted, and where acc applies it (manifest, dry run, acc env, tracker configuration)."""

from __future__ import annotations

import json

import pytest

from acc.assembly.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_data,
    redact_environ,
    redact_shell,
    redact_text,
)

SECRET_NAMES = ["--hf_token", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "hfToken", "WANDB_API_KEY", "wandb.api-key",
                "COMET_API_KEY", "NEPTUNE_API_TOKEN", "MLFLOW_TRACKING_PASSWORD", "CLEARML_API_SECRET_KEY",
                "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GITHUB_TOKEN", "password", "db-passwd", "APIKey",
                "use_auth_token", "AZURE_STORAGE_CONNECTION_STRING", "client_secret", "credentials"]
PLAIN_NAMES = ["--lr", "tokenizer", "max_tokens", "--num-tokens", "keys", "author", "PWD", "monkey", "--output_dir",
               "seed", "HOME", "PATH", "keyboard_layout"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_credential_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_names_that_only_contain_a_credential_word_are_not_redacted(name):
    assert not is_secret_name(name)


def test_command_lines_in_every_spelling():
    argv = ["train.py", "--hf_token", "abc123", "--lr", "0.1", "--api-key=xyz", "trainer.hub_token=qq", "-token", "t",
            "--use_auth_token", "--tokenizer", "gpt2", "--secret", "--next"]
    assert redact_argv(argv) == ["train.py", "--hf_token", REDACTED, "--lr", "0.1", f"--api-key={REDACTED}",
                                 f"trainer.hub_token={REDACTED}", "-token", REDACTED, "--use_auth_token",
                                 "--tokenizer", "gpt2", "--secret", "--next"]


def test_token_shaped_values_and_url_passwords_whatever_the_name():
    hf = "hf_" + "a1B2" * 8
    assert redact_argv(["x.py", hf, "--model", "gpt2"]) == ["x.py", REDACTED, "--model", "gpt2"]
    assert redact_text(f"Authorization {hf} ghp_{'x' * 36} AKIAABCDEFGHIJKLMNOP") == \
        f"Authorization {REDACTED} {REDACTED} {REDACTED}"
    assert redact_text("https://alice:pa55w0rd@mlflow.example.com/x") == f"https://alice:{REDACTED}@mlflow.example.com/x"
    assert redact_text("https://mlflow.example.com:5000/x") == "https://mlflow.example.com:5000/x"  # a port stays


def test_data_environment_and_shell_lines():
    config = {"lr": 0.1, "hf_token": "abc", "nested": {"wandb_api_key": "k", "tokenizer": "gpt2"}, "flag": True,
              "use_auth_token": True, "layers": [1, 2], "none_token": None}
    assert redact_data(config) == {"lr": 0.1, "hf_token": REDACTED, "nested": {"wandb_api_key": REDACTED,
                                   "tokenizer": "gpt2"}, "flag": True, "use_auth_token": True, "layers": [1, 2],
                                   "none_token": None}
    assert redact_environ({"HF_TOKEN": "abc", "PATH": "/bin", "EMPTY_TOKEN": ""}) == \
        {"HF_TOKEN": REDACTED, "PATH": "/bin", "EMPTY_TOKEN": ""}
    assert redact_shell("python t.py --hf_token 'a b'") == f"python t.py --hf_token '{REDACTED}'"
    line = "function tests.workers.f(*args)"
    assert redact_shell(line) == line  # nothing to redact: the text is kept as it was (no re-quoting)


def test_the_run_manifest_and_the_dry_run_redact_script_arguments(tmp_path):
    from click.testing import CliRunner

    from acc.cli import cli

    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    secret = "s3cr3t-value-7f1e"
    result = CliRunner().invoke(cli, ["launch", "--dry-run", "--backend", "ddp", "--nproc", "2", str(script),
                                      "--hf_token", secret, f"--api_key={secret}"])
    assert result.exit_code == 0, result.output
    assert secret not in result.output and f"--hf_token {REDACTED}" in result.output.replace("'", "")

    from acc.assembly import manifest

    data = manifest.build({"backend": "cpu", "num_machines": 1, "nproc": 1, "mixed_precision": "no",
                           "gradient_accumulation_steps": 1, "hub_token": secret}, {}, {},
                          ["acc", "launch", "t.py", "--hf_token", secret])
    text = json.dumps(data)
    assert secret not in text and data["command"][-1] == REDACTED
    assert data["settings"]["values"]["hub_token"] == REDACTED
