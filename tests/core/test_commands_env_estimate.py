"""Accelerate's `env`, `estimate-memory` and `test` commands on acc (`acc.commands.env`, `.estimate`, `.test`): the
report's keys and the executable lookup, estimates equal to sizes counted by hand, the Hub path's errors (with
huggingface_hub absent, and with a stand-in for it), and `test_command` on real `acc launch` runs."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
import types
import uuid
from pathlib import Path

import pytest

import acc.commands.env as env_cmd
import acc.commands.estimate as estimate_cmd
import acc.commands.test as test_cmd
from acc.contract.version import __version__
from tests.conftest import ACC, run

ACCELERATE_KEYS = ["`Accelerate` version", "Platform", "`accelerate` bash location", "Python version",
                   "Numpy version", "PyTorch version", "PyTorch accelerator", "System RAM", "`Accelerate` configs"]
ACCELERATE_YAML = ("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: bf16\n"
                   "num_processes: 1\nuse_cpu: true\n")


def test_importing_the_commands_imports_neither_torch_nor_the_hub_nor_the_cli():
    code = ("import sys\nimport acc.commands.env, acc.commands.estimate, acc.commands.test\n"
            "print(sorted(m for m in ('torch', 'huggingface_hub', 'acc.cli') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# ---------------------------------------------------------------------------------------------- env


def test_env_command_has_accelerates_keys_and_says_not_found_without_the_executable(monkeypatch, tmp_path, capsys):
    looked_up = []
    monkeypatch.setattr(env_cmd, "which", lambda name: looked_up.append(name))
    monkeypatch.setattr(env_cmd, "default_config_file", str(tmp_path / "no-such" / "default_config.yaml"))
    info = env_cmd.env_command(env_cmd.env_command_parser().parse_args([]))
    assert looked_up == ["acc"]
    assert [k for k in ACCELERATE_KEYS if k not in info] == []
    assert info["`accelerate` bash location"] == "Not found" and info["`Accelerate` configs"] == "Not found"
    assert info["`Accelerate` version"] == __version__
    import numpy
    import torch

    assert info["Numpy version"] == numpy.__version__ and info["PyTorch version"] == torch.__version__
    assert info["PyTorch accelerator"] == ("CUDA" if torch.cuda.is_available() else "N/A")
    assert ("GPU type" in info) == torch.cuda.is_available()
    # acc's own rows: the builtin backend reports itself, the config acc resolves is named
    cpu = next(v for k, v in info.items() if k.startswith("`acc` plugin cpu (acc-core"))
    assert cpu["torch"] == torch.__version__
    assert info["`acc` config"]["files"].startswith("none found")
    printed = capsys.readouterr().out
    assert "Copy-and-paste the text below in your GitHub issue" in printed
    assert "- `accelerate` bash location: Not found" in printed
    assert "- `Accelerate` default config:\n\tNot found" in printed


def test_env_command_reports_the_executable_and_an_accelerate_config_file(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(env_cmd, "which", lambda name: f"/opt/bin/{name}")
    (tmp_path / "a.yaml").write_text(ACCELERATE_YAML)
    info = env_cmd.env_command(env_cmd.env_command_parser().parse_args(["-c", "a.yaml"]))
    assert info["`accelerate` bash location"] == "/opt/bin/acc"
    config = info["`Accelerate` configs"]
    assert config["distributed_type"] == "NO" and config["mixed_precision"] == "bf16" and config["use_cpu"] is True
    assert info["`acc` config"]["mixed_precision"] == "bf16  (config file a.yaml)"
    assert "- `Accelerate` config passed:\n\t- compute_environment: LOCAL_MACHINE" in capsys.readouterr().out


def test_env_command_refuses_a_config_file_that_does_not_exist():
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        env_cmd.env_command(env_cmd.env_command_parser().parse_args(["--config_file", "missing.yaml"]))


def test_env_command_and_acc_env_report_the_same_figures(tmp_path):
    proc = run([ACC, "env"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = {line[:25].strip(): line[25:].strip() for line in proc.stdout.splitlines() if line.startswith("  ")}
    info = env_cmd.env_command(argparse.Namespace(config_file=None))
    assert lines["system RAM"] == info["System RAM"] and lines["numpy"] == info["Numpy version"]
    assert lines["torch"] == info["PyTorch version"] and lines["torch accelerator"] == info["PyTorch accelerator"]


def test_a_plugin_report_that_fails_is_reported_and_secrets_are_redacted(monkeypatch):
    from acc.errors import AccError
    from acc.runtime import environment_report

    def info(name, module):
        def load_module():
            if isinstance(module, Exception):
                raise module
            return module
        return types.SimpleNamespace(name=name, distribution=f"acc-{name}", version="9.9", load_module=load_module)

    good = types.SimpleNamespace(acc_env_report=lambda settings: {"api_token": "abc123", "threads": 4})
    broken = types.SimpleNamespace(acc_env_report=lambda settings: 1 / 0)
    monkeypatch.setattr(environment_report, "installed_backends",
                        lambda: {"good": info("good", good), "gone": info("gone", AccError("cannot import it"))})
    monkeypatch.setattr(environment_report, "installed_plugins", lambda: {"broken": info("broken", broken)})
    reports = {r.name: r for r in environment_report.plugin_reports(settings=None)}
    assert reports["good"].rows == {"api_token": "<redacted>", "threads": "4"} and reports["good"].error is None
    assert reports["gone"].error == "error: cannot import it"
    assert reports["broken"].error == "error while reporting: ZeroDivisionError: division by zero"


# ---------------------------------------------------------------------------------------------- estimate

MODELS = textwrap.dedent("""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.up = nn.Linear(d, 4 * d)
            self.down = nn.Linear(4 * d, d, bias=False)

    class Net(nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self, d=16, vocab=300):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block(d) for _ in range(2))
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.embed.weight          # tied: counted once
            self.register_buffer("pos", torch.arange(8, dtype=torch.float32))
            self.register_buffer("mask", torch.ones(64, dtype=torch.bool))  # a bool is one bit

    def build():
        return Net()

    def wide():
        return Net(d=64, vocab=10)                          # a Block outweighs the embedding
""")


@pytest.fixture
def models(tmp_path: Path) -> str:
    name = f"estmodels_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(MODELS)
    yield name
    sys.modules.pop(name, None)


def _by_hand(d: int, vocab: int) -> tuple[float, int]:
    """Total bytes (float32 weights, tied once, 8 float32 + 64 bool buffer elements) and the largest layer."""
    embed = vocab * d * 4
    block = (d * 4 * d + 4 * d + 4 * d * d) * 4
    return embed + 2 * block + 8 * 4 + 64 / 8, max(embed, block)


@pytest.mark.parametrize("factory,d,vocab", [("build", 16, 300), ("wide", 64, 10)])
def test_an_acc_import_path_is_estimated_with_the_sizes_counted_by_hand(models, factory, d, vocab):
    total, largest = _by_hand(d, vocab)
    args = estimate_cmd.estimate_command_parser().parse_args([f"{models}:{factory}"])
    rows = estimate_cmd.gather_data(args)
    assert [r[0] for r in rows] == ["float32", "float16", "int8", "int4"]
    assert rows[0][1:3] == [largest, total]
    assert rows[0][3] == {"model": total, "optimizer": 2 * total, "gradients": total, "step": 4 * total}
    for row, divisor in zip(rows[1:], (2, 4, 8)):
        assert row[1:3] == [largest / divisor, total / divisor]
    assert rows[1][3] == {"model": total, "optimizer": 2 * total, "gradients": total + total // 2, "step": 2 * total}
    assert set(rows[2][3].values()) == {-1} and set(rows[3][3].values()) == {-1}


def test_the_table_shows_the_converted_sizes(models, capsys):
    from acc.utils import convert_bytes

    total, largest = _by_hand(16, 300)
    estimate_cmd.estimate_command(estimate_cmd.estimate_command_parser().parse_args(
        [f"{models}:build", "--dtypes", "float32", "int8"]))
    out = capsys.readouterr().out
    cells = [[c.strip() for c in line.strip("│").split("│")] for line in out.splitlines() if line.startswith("│")]
    assert cells[0] == [f"Memory Usage for loading `{models}:build`"]
    assert cells[1] == ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    float32, int8 = cells[2:]
    assert float32 == ["float32", convert_bytes(largest), convert_bytes(total), convert_bytes(4 * total)]
    assert int8 == ["int8", convert_bytes(largest / 4), convert_bytes(total / 4), "N/A"]


def test_the_table_widens_for_a_long_title():
    table = estimate_cmd.create_ascii_table(["a", "b"], [["1", "2"]], "a title much longer than the columns")
    widths = {len(line) for line in table.splitlines()}
    assert len(widths) == 1 and "a title much longer than the columns" in table


def test_an_import_path_with_a_library_name_or_a_bad_path_is_a_clear_error(models):
    from acc.errors import AccError

    with pytest.raises(ValueError, match="is an acc import path .* leave it out"):
        estimate_cmd.create_empty_model(f"{models}:build", library_name="timm")
    with pytest.raises(AccError, match="has no attribute 'biuld' \\(did you mean 'build'\\?\\)"):
        estimate_cmd.gather_data(estimate_cmd.estimate_command_parser().parse_args([f"{models}:biuld"]))


def test_estimate_training_usage_per_precision():
    assert estimate_cmd.estimate_training_usage(1000, "float32") == {"model": 1000, "optimizer": 2000,
                                                                     "gradients": 1000, "step": 4000}
    mixed = {"model": 1000, "optimizer": 2000, "gradients": 1500, "step": 2000}
    assert estimate_cmd.estimate_training_usage(1000, "bfloat16") == mixed
    assert estimate_cmd.estimate_training_usage(1000, "fp8") == mixed
    assert set(estimate_cmd.estimate_training_usage(1000, "fp8", msamp_config="O2").values()) == {-1}
    assert set(estimate_cmd.estimate_training_usage(1000, "int4").values()) == {-1}


@pytest.mark.parametrize("name,expected", [
    ("resnet50", "resnet50"), ("resnet50.a1_in1k", "resnet50.a1_in1k"),
    ("timm/resnet50.a1_in1k", "hf-hub:timm/resnet50.a1_in1k"),
    ("hf-hub:timm/resnet50.a1_in1k", "hf-hub:timm/resnet50.a1_in1k"),
    ("local-dir:/path/to/model", "local-dir:/path/to/model"),
])
def test_add_timm_hub_prefix(name, expected):
    assert estimate_cmd.add_timm_hub_prefix(name) == expected


def test_the_parser_takes_both_spellings_and_registers_as_a_subcommand():
    parser = estimate_cmd.estimate_command_parser()
    args = parser.parse_args(["org/model", "--library-name", "timm", "--trust-remote-code", "--dtypes", "int4"])
    assert (args.library_name, args.trust_remote_code, args.dtypes) == ("timm", True, ["int4"])
    with pytest.raises(SystemExit):
        parser.parse_args(["org/model", "--dtypes", "float64"])
    subparsers = argparse.ArgumentParser().add_subparsers()
    for make, name, func in ((estimate_cmd.estimate_command_parser, "estimate-memory", estimate_cmd.estimate_command),
                             (env_cmd.env_command_parser, "env", env_cmd.env_command),
                             (test_cmd.test_command_parser, "test", test_cmd.test_command)):
        make(subparsers)
        assert subparsers.choices[name].get_default("func") is func


def test_without_huggingface_hub_a_hub_model_is_an_import_error_naming_pip(monkeypatch):
    for name in [m for m in sys.modules if m == "huggingface_hub" or m.startswith("huggingface_hub.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` fails as if absent
    with pytest.raises(ImportError, match="needs huggingface_hub, which is not installed: pip install huggingface_hub"):
        estimate_cmd.estimate_command(estimate_cmd.estimate_command_parser().parse_args(["org/model"]))
    with pytest.raises(ImportError, match="pip install huggingface_hub"):
        estimate_cmd.verify_on_hub("org/model")
    assert estimate_cmd.check_has_model(KeyError("architecture")) in ("timm", "unknown")


class _HubError(OSError):
    def __init__(self, message: str, response=None):  # huggingface_hub < 1.0's signature
        super().__init__(message)
        self.response = response


@pytest.fixture
def fake_hub(monkeypatch):
    """A stand-in for huggingface_hub whose `model_info` raises `hub.error` (or returns `hub.info`)."""
    hub = types.ModuleType("huggingface_hub")
    utils = types.ModuleType("huggingface_hub.utils")
    utils.RepositoryNotFoundError = type("RepositoryNotFoundError", (_HubError,), {})
    utils.GatedRepoError = type("GatedRepoError", (utils.RepositoryNotFoundError,), {})
    utils.EntryNotFoundError = type("EntryNotFoundError", (_HubError,), {})
    hub.utils, hub.error, hub.info = utils, None, None
    hub.calls = []

    def model_info(repo, token=None):
        hub.calls.append((repo, token))
        if hub.error is not None:
            raise hub.error
        return hub.info

    hub.model_info = model_info
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    monkeypatch.setitem(sys.modules, "huggingface_hub.utils", utils)
    return hub


def test_verify_on_hub_names_gated_and_missing_repos(fake_hub):
    fake_hub.error = fake_hub.utils.GatedRepoError("403")
    assert estimate_cmd.verify_on_hub("org/gated", token="t") == "gated" and fake_hub.calls == [("org/gated", "t")]
    fake_hub.error = fake_hub.utils.RepositoryNotFoundError("404")
    assert estimate_cmd.verify_on_hub("org/none") == "repo"
    fake_hub.error, fake_hub.info = None, "INFO"
    assert estimate_cmd.verify_on_hub("org/model") == "INFO"


def test_an_unreachable_hub_is_an_os_error_saying_so(fake_hub):
    offline = type("OfflineModeIsEnabled", (ConnectionError,), {})
    fake_hub.error = offline("Cannot reach https://huggingface.co/api/models/org/m: offline mode is enabled.")
    with pytest.raises(OSError, match="cannot look up `org/m` on the Hugging Face Hub: OfflineModeIsEnabled") as err:
        estimate_cmd.estimate_command(estimate_cmd.estimate_command_parser().parse_args(["org/m"]))
    assert "HF_HUB_OFFLINE unset" in str(err.value) and "package.module:factory" in str(err.value)
    transport = type("ConnectError", (Exception,), {"__module__": "httpx"})
    fake_hub.error = transport("Name or service not known")
    with pytest.raises(OSError, match="ConnectError: Name or service not known"):
        estimate_cmd.verify_on_hub("org/m")
    fake_hub.error = type("HFValidationError", (ValueError,), {})("bad repo id")
    with pytest.raises(ValueError, match="bad repo id"):  # not a network failure: raised as it is
        estimate_cmd.verify_on_hub("a/b/c")


def test_gated_and_missing_repos_raise_the_hubs_errors(fake_hub, monkeypatch):
    monkeypatch.setattr(estimate_cmd, "verify_on_hub", lambda repo, token=None: "gated")
    args = estimate_cmd.estimate_command_parser().parse_args(["meta-llama/Llama-2-7b-hf"])
    with pytest.raises(fake_hub.utils.GatedRepoError, match="is gated. You must be authenticated") as err:
        estimate_cmd.estimate_command(args)
    assert isinstance(err.value, OSError)
    monkeypatch.setattr(estimate_cmd, "verify_on_hub", lambda repo, token=None: "repo")
    with pytest.raises(OSError, match="Repo for model `somebrokenname` does not exist on the Hub") as err:
        estimate_cmd.estimate_command(estimate_cmd.estimate_command_parser().parse_args(["somebrokenname"]))
    assert isinstance(err.value, fake_hub.utils.RepositoryNotFoundError)


def test_a_hub_model_without_library_metadata_or_an_unknown_library_is_a_value_error(fake_hub, monkeypatch):
    monkeypatch.setattr(estimate_cmd, "verify_on_hub",
                        lambda repo, token=None: types.SimpleNamespace(library_name=None, config=None))
    with pytest.raises(ValueError, match="does not have any library metadata on the Hub.*--library_name"):
        estimate_cmd.gather_data(estimate_cmd.estimate_command_parser().parse_args(["org/m"]))
    with pytest.raises(ValueError, match="Library `diffusers` is not supported yet"):
        estimate_cmd.create_empty_model("org/m", library_name="diffusers")


def test_the_real_hubs_gated_error_is_an_os_error(monkeypatch):
    hub_utils = pytest.importorskip("huggingface_hub.utils")
    monkeypatch.setattr(estimate_cmd, "verify_on_hub", lambda repo, token=None: "gated")
    with pytest.raises(hub_utils.GatedRepoError) as err:
        estimate_cmd.create_empty_model("meta-llama/Llama-2-7b-hf", library_name=None)
    assert isinstance(err.value, OSError) and "is gated" in str(err.value)


# ---------------------------------------------------------------------------------------------- test


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / f"script_{uuid.uuid4().hex[:6]}.py"
    path.write_text(body)
    return path


def test_test_command_says_success_when_the_launched_script_passes(tmp_path, monkeypatch, capsys):
    (tmp_path / "run.toml").write_text('mixed_precision = "bf16"\n')
    script = _script(tmp_path, "import sys\nfrom acc.accelerator import Accelerator\n"
                               "sys.exit(0 if Accelerator().mixed_precision == 'bf16' else 5)\n")
    monkeypatch.setattr(test_cmd, "test_script_path", lambda: script)
    test_cmd.test_command(test_cmd.test_command_parser().parse_args(["--config_file", "run.toml"]))
    out = capsys.readouterr().out
    assert "launch --config-file run.toml" in out and out.rstrip().endswith(test_cmd.SUCCESS)
    assert test_cmd.SUCCESS == "Test is a success! You are ready for your distributed training!"


def test_test_command_raises_when_the_launched_script_fails(tmp_path, monkeypatch, capsys):
    script = _script(tmp_path, "import sys\nprint('boom', file=sys.stderr)\nsys.exit(3)\n")
    monkeypatch.setattr(test_cmd, "test_script_path", lambda: script)
    with pytest.raises(RuntimeError, match="failed with returncode 3") as err:
        test_cmd.test_command(argparse.Namespace(config_file=None))
    assert "boom" in str(err.value) and test_cmd.SUCCESS not in capsys.readouterr().out


def test_test_command_runs_accs_test_script_on_one_process(capsys):
    assert test_cmd.test_script_path().is_file()
    test_cmd.test_command(test_cmd.test_command_parser().parse_args([]))  # a failing check raises RuntimeError
    assert capsys.readouterr().out.rstrip().endswith(test_cmd.SUCCESS)
