"""acc.commands.config.config_args, acc.commands.to_fsdp2 and acc.commands.tpu: Accelerate's config-file classes,
its FSDP1 -> FSDP2 config conversion and its `tpu-config` gcloud command, held to Accelerate 1.15's behaviour."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from acc.commands import to_fsdp2, tpu
from acc.commands.config import config_args
from acc.commands.config.config_args import BaseConfig, ClusterConfig, SageMakerConfig, load_config_from_file
from acc.commands.to_fsdp2 import convert_config_to_fsdp2, to_fsdp2_command, to_fsdp2_command_parser
from acc.commands.tpu import tpu_command_launcher, tpu_command_parser
from acc.contract.enums import ComputeEnvironment, DistributedType, SageMakerDistributedType

FSDP1 = {
    "compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 2,
    "fsdp_config": {
        "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_use_orig_params": True, "fsdp_sync_module_states": True,
        "fsdp_forward_prefetch": False, "fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_offload_params": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT", "my_own_key": "kept",
    },
}


def _write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# ---------------------------------------------------------------------------------------------- config_args


def test_string_enums_become_accs_enum_members():
    config = ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="MULTI_GPU", mixed_precision="fp16",
                           use_cpu=False, debug=False, num_processes=4)
    assert config.compute_environment is ComputeEnvironment.LOCAL_MACHINE
    assert config.distributed_type is DistributedType.MULTI_GPU
    assert config.mixed_precision == "fp16" and config.num_processes == 4
    # the plugin tables default to empty mappings, as in Accelerate
    assert config.fsdp_config == {} and config.deepspeed_config == {} and config.dynamo_config == {}
    sage = SageMakerConfig(compute_environment="AMAZON_SAGEMAKER", distributed_type="DATA_PARALLEL",
                           mixed_precision="no", use_cpu=False, debug=False, ec2_instance_type="ml.p3.2xlarge",
                           iam_role_name="role")
    assert sage.distributed_type is SageMakerDistributedType.DATA_PARALLEL
    assert sage.base_job_name == "accelerate-sagemaker-1" and sage.region == "us-east-1"


def test_a_bad_enum_value_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"distributed_type 'MULTI_GPUS'.*MULTI_GPU.*did you mean 'MULTI_GPU'"):
        BaseConfig(compute_environment="LOCAL_MACHINE", distributed_type="MULTI_GPUS", mixed_precision="no",
                   use_cpu=False, debug=False)
    with pytest.raises(ValueError, match="compute_environment 'CLOUD'.*LOCAL_MACHINE, AMAZON_SAGEMAKER"):
        BaseConfig(compute_environment="CLOUD", distributed_type="NO", mixed_precision="no", use_cpu=False,
                   debug=False)


def test_yaml_round_trip_writes_plain_values_and_reads_back_the_same_config(tmp_path):
    config = ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="FSDP", mixed_precision="bf16",
                           use_cpu=False, debug=False, num_processes=8, num_machines=2, main_process_ip="10.0.0.1",
                           main_process_port=29500, fsdp_config={"fsdp_version": 2, "fsdp_offload_params": True},
                           commands=["ls"], dynamo_config={"dynamo_backend": "INDUCTOR"})
    path = tmp_path / "config.yaml"
    config.to_yaml_file(str(path))
    raw = yaml.safe_load(path.read_text())
    assert raw["distributed_type"] == "FSDP" and type(raw["distributed_type"]) is str
    assert "deepspeed_config" not in raw and "gpu_ids" not in raw  # empty tables and None are left out
    assert raw["fsdp_config"] == {"fsdp_version": 2, "fsdp_offload_params": True}
    again = load_config_from_file(str(path))
    assert isinstance(again, ClusterConfig) and again == config
    # writing does not change the config it writes
    assert config.distributed_type is DistributedType.FSDP and config.deepspeed_config == {}
    # enums inside a table are written as their values too, and an empty table inside one as None
    nested = ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="NO", mixed_precision="no",
                           use_cpu=False, debug=False, dynamo_config={"backend": DistributedType.XLA, "options": {}})
    assert nested.to_dict()["dynamo_config"] == {"backend": "XLA", "options": None}
    assert type(nested.to_dict()["dynamo_config"]["backend"]) is str
    nested.to_yaml_file(str(tmp_path / "nested.yaml"))
    assert "backend: XLA" in (tmp_path / "nested.yaml").read_text()


def test_json_round_trip_is_sorted_and_indented(tmp_path):
    config = ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="MULTI_CPU", mixed_precision="no",
                           use_cpu=True, debug=False, num_processes=3)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    text = path.read_text()
    assert text.endswith("}\n") and '\n  "compute_environment": "LOCAL_MACHINE",' in text
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert ClusterConfig.from_json_file(str(path)) == config
    assert load_config_from_file(path) == config  # a PathLike too


def test_loading_fills_defaults_and_converts_older_keys(tmp_path):
    path = _write_yaml(tmp_path / "old.yaml", {"distributed_type": "NO", "fp16": True, "dynamo_backend": "INDUCTOR"})
    config = load_config_from_file(str(path))
    assert config.compute_environment is ComputeEnvironment.LOCAL_MACHINE
    assert config.num_processes == 1 and config.mixed_precision == "fp16"
    assert config.dynamo_config == {"dynamo_backend": "INDUCTOR"}
    assert config.use_cpu is False and config.debug is False and config.enable_cpu_affinity is False
    assert load_config_from_file(str(_write_yaml(tmp_path / "no.yaml", {"distributed_type": "NO",
                                                                        "dynamo_backend": "NO"}))).dynamo_config == {}


def test_a_sagemaker_file_loads_as_a_sagemaker_config(tmp_path):
    path = _write_yaml(tmp_path / "sm.yaml", {"compute_environment": "AMAZON_SAGEMAKER", "distributed_type": "NO",
                                              "mixed_precision": "fp16", "ec2_instance_type": "MY_TYPE",
                                              "iam_role_name": "MY_ROLE"})
    config = load_config_from_file(str(path))
    assert isinstance(config, SageMakerConfig)
    assert config.distributed_type is SageMakerDistributedType.NO and config.iam_role_name == "MY_ROLE"


def test_unknown_keys_are_refused_by_name(tmp_path):
    path = _write_yaml(tmp_path / "bad.yaml", {"distributed_type": "NO", "invalid_key": 1, "num_proceses": 2})
    with pytest.raises(ValueError) as info:
        load_config_from_file(str(path))
    message = str(info.value)
    assert f"The config file at {path} had unknown keys (['invalid_key', 'num_proceses'])" in message
    assert "did you mean 'num_processes'" in message and "main_process_port" in message
    json_path = tmp_path / "bad.json"
    json_path.write_text(json.dumps({"distributed_type": "NO", "another_invalid_key": 1}))
    with pytest.raises(ValueError, match=r"unknown keys \(\['another_invalid_key'\]\)"):
        load_config_from_file(str(json_path))


def test_a_missing_distributed_type_or_file_says_how_to_fix_it(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="no `distributed_type`.*distributed_type: 'NO'"):
        load_config_from_file(str(_write_yaml(tmp_path / "c.yaml", {"mixed_precision": "no"})))
    with pytest.raises(FileNotFoundError, match="nope.yaml` given does not exist"):
        load_config_from_file(str(tmp_path / "nope.yaml"))
    monkeypatch.setattr(config_args, "default_config_file", str(tmp_path / "default.yaml"))
    with pytest.raises(FileNotFoundError, match="default one .*default.yaml.* does not exist.*accelerate config"):
        load_config_from_file(None)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="holds a list, not a mapping"):
        load_config_from_file(str(tmp_path / "list.yaml"))


def test_default_paths_follow_hf_home_as_accelerate_does():
    code = ("import acc.commands.config.config_args as c; "
            "print(c.hf_cache_home, c.cache_dir, c.default_config_file, c.default_yaml_config_file, "
            "c.default_json_config_file)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"HF_HOME": "/somewhere/hf", "PATH": "/usr/bin:/bin"}).stdout.split()
    assert out == ["/somewhere/hf", "/somewhere/hf/accelerate", *["/somewhere/hf/accelerate/default_config.yaml"] * 3]


def test_cluster_config_fields_are_the_keys_accs_accelerate_reader_knows():
    from acc.compat.accelerate_config import _TOP_KEYS

    assert set(ClusterConfig.__dataclass_fields__) == set(_TOP_KEYS) - {"fp16", "dynamo_backend"}


def test_the_modules_import_without_torch_or_accs_cli():
    code = ("import sys, acc.commands.config.config_args, acc.commands.to_fsdp2, acc.commands.tpu; "
            "print(sorted(m for m in sys.modules if m in ('torch', 'acc.cli', 'yaml')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------------------------- to_fsdp2


def test_convert_drops_fsdp1_keys_maps_the_strategy_and_keeps_unknown_keys():
    config = json.loads(json.dumps(FSDP1))
    out = convert_config_to_fsdp2(config)
    assert out is config and out["distributed_type"] == "FSDP"
    assert out["fsdp_config"] == {
        "fsdp_reshard_after_forward": False, "fsdp_offload_params": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT", "my_own_key": "kept", "fsdp_version": 2,
    }


@pytest.mark.parametrize("strategy, reshard", [("FULL_SHARD", True), ("SHARD_GRAD_OP", False), ("HYBRID_SHARD", True),
                                               ("HYBRID_SHARD_ZERO2", False), ("NO_SHARD", False)])
def test_each_sharding_strategy_maps_to_reshard_after_forward(strategy, reshard):
    for key in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward"):
        out = convert_config_to_fsdp2({"fsdp_config": {key: strategy}})["fsdp_config"]
        assert out == {"fsdp_reshard_after_forward": reshard, "fsdp_version": 2}


def test_convert_leaves_fsdp2_and_fsdp_less_configs_alone(caplog):
    already = {"fsdp_config": {"fsdp_version": 2, "fsdp_sharding_strategy": "FULL_SHARD"}}
    with caplog.at_level("WARNING"):
        assert convert_config_to_fsdp2(already) == {"fsdp_config": {"fsdp_version": 2,
                                                                   "fsdp_sharding_strategy": "FULL_SHARD"}}
    assert "Config already specifies FSDP2, skipping conversion..." in caplog.text
    assert convert_config_to_fsdp2({"distributed_type": "NO"}) == {"distributed_type": "NO"}


def test_to_fsdp2_command_writes_the_output_file(tmp_path):
    source = _write_yaml(tmp_path / "fsdp1.yaml", FSDP1)
    output = tmp_path / "fsdp2.yaml"
    to_fsdp2_command(to_fsdp2_command_parser().parse_args(["--config-file", str(source), "--output-file",
                                                           str(output)]))
    assert yaml.safe_load(source.read_text()) == FSDP1  # the input is left as it was
    config = load_config_from_file(str(output))
    assert isinstance(config, ClusterConfig) and config.fsdp_config["fsdp_version"] == 2
    assert "fsdp_use_orig_params" not in config.fsdp_config and config.num_processes == 2


def test_to_fsdp2_overwrite_replaces_the_input(tmp_path):
    source = _write_yaml(tmp_path / "fsdp1.yaml", FSDP1)
    to_fsdp2_command(to_fsdp2_command_parser().parse_args(["--config_file", str(source), "--overwrite"]))
    assert yaml.safe_load(source.read_text())["fsdp_config"]["fsdp_reshard_after_forward"] is False


def test_to_fsdp2_errors(tmp_path):
    parser = to_fsdp2_command_parser()
    with pytest.raises(FileNotFoundError, match="missing.yaml not found"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(tmp_path / "missing.yaml")]))
    source = _write_yaml(tmp_path / "fsdp1.yaml", FSDP1)
    with pytest.raises(ValueError, match="If --overwrite is not set, --output_file must be provided"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(source)]))
    taken = tmp_path / "taken.yaml"
    taken.write_text("keep: me\n")
    with pytest.raises(FileExistsError, match="taken.yaml already exists and --overwrite is not set"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(source), "--output_file", str(taken)]))
    assert taken.read_text() == "keep: me\n"
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ValueError, match="empty"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(tmp_path / "empty.yaml"), "--overwrite"]))


def test_to_fsdp2_registers_as_a_subcommand():
    import argparse

    subparsers = argparse.ArgumentParser().add_subparsers()
    parser = to_fsdp2_command_parser(subparsers)
    args = parser.parse_args(["--config_file", "x.yaml", "--overwrite"])
    assert args.func is to_fsdp2.to_fsdp2_command and args.overwrite is True and args.output_file is None


# ---------------------------------------------------------------------------------------------- tpu-config

GCLOUD = "Running gcloud compute tpus tpu-vm ssh"


@pytest.fixture
def no_default_config(tmp_path, monkeypatch):
    monkeypatch.setattr(tpu, "default_config_file", str(tmp_path / "absent" / "default_config.yaml"))


def _run(capsys, argv: list[str]) -> str:
    tpu_command_launcher(tpu_command_parser().parse_args(argv))
    return capsys.readouterr().out


@pytest.fixture
def tpu_config(tmp_path):
    commands = tmp_path / "commands.sh"
    commands.write_text('echo "hello world"\necho "this is a second command"')
    return _write_yaml(tmp_path / "tpu.yaml", {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO",
                                               "mixed_precision": "no", "tpu_name": "cfg-tpu", "tpu_zone": "europe-1",
                                               "command_file": str(commands)})


def test_tpu_base_command(capsys, no_default_config):
    out = _run(capsys, ["--command", "ls", "--tpu_zone", "us-central1-a", "--tpu_name", "test-tpu", "--debug"])
    assert out == f"{GCLOUD} test-tpu --zone us-central1-a --command cd /usr/share; ls --worker all\n"
    out = _run(capsys, ["--command", "ls", "--command", "pwd", "--tpu-zone", "z", "--tpu-name", "t", "--use-alpha",
                        "--debug"])
    assert out == "Running gcloud alpha compute tpus tpu-vm ssh t --zone z --command cd /usr/share; ls; pwd --worker all\n"


def test_tpu_takes_name_zone_and_command_file_from_the_config(capsys, tpu_config, no_default_config):
    out = _run(capsys, ["--config_file", str(tpu_config), "--debug"])
    assert out == (f'{GCLOUD} cfg-tpu --zone europe-1 --command cd /usr/share; echo "hello world"; '
                   'echo "this is a second command" --worker all\n')
    # flags win over the file; --command replaces its command file
    out = _run(capsys, ["--config_file", str(tpu_config), "--tpu_name", "flag-tpu", "--command", "ls", "--debug"])
    assert out == f"{GCLOUD} flag-tpu --zone europe-1 --command cd /usr/share; ls --worker all\n"


def test_tpu_reads_the_default_config_when_present(capsys, tpu_config, monkeypatch):
    monkeypatch.setattr(tpu, "default_config_file", str(tpu_config))
    monkeypatch.setattr(config_args, "default_config_file", str(tpu_config))
    assert f"{GCLOUD} cfg-tpu --zone europe-1 --command cd /usr/share; echo" in _run(capsys, ["--debug"])


def test_tpu_command_file_and_config_commands(capsys, tmp_path, no_default_config):
    script = tmp_path / "setup.sh"
    script.write_text("pip install -r req.txt\nmake\n")
    out = _run(capsys, ["--command_file", str(script), "--tpu_name", "t", "--tpu_zone", "z", "--debug"])
    assert out == f"{GCLOUD} t --zone z --command cd /usr/share; pip install -r req.txt; make --worker all\n"
    config = _write_yaml(tmp_path / "c.yaml", {"distributed_type": "NO", "tpu_name": "t", "tpu_zone": "z",
                                               "commands": ["a", "b"]})
    out = _run(capsys, ["--config_file", str(config), "--debug"])
    assert out == f"{GCLOUD} t --zone z --command cd /usr/share; a; b --worker all\n"


@pytest.mark.parametrize("version, line", [(None, "pip install accelerate -U"),
                                           ("12.0.0", "pip install accelerate==12.0.0"),
                                           ("dev", "pip install git+https://github.com/huggingface/accelerate.git")])
def test_tpu_install_accelerate_lines(capsys, tpu_config, no_default_config, version, line):
    argv = ["--config_file", str(tpu_config), "--install_accelerate", "--debug"]
    if version is not None:
        argv += ["--accelerate_version", version]
    out = _run(capsys, argv)
    assert out == (f'{GCLOUD} cfg-tpu --zone europe-1 --command cd /usr/share; {line}; echo "hello world"; '
                   'echo "this is a second command" --worker all\n')


def test_tpu_errors_say_what_to_pass(capsys, no_default_config):
    with pytest.raises(ValueError, match="--command COMMAND .* or --command_file FILE"):
        _run(capsys, ["--tpu_name", "t", "--tpu_zone", "z", "--debug"])
    with pytest.raises(ValueError, match="No TPU zone was given: pass --tpu_zone"):
        _run(capsys, ["--tpu_name", "t", "--command", "ls", "--debug"])
    with pytest.raises(ValueError, match="'not-a-version' is not a version: give 'latest'"):
        _run(capsys, ["--tpu_name", "t", "--tpu_zone", "z", "--command", "ls", "--install_accelerate",
                      "--accelerate_version", "not-a-version", "--debug"])


def test_tpu_runs_gcloud_without_debug(capsys, tmp_path, monkeypatch, no_default_config):
    calls = []

    class Done:
        returncode = 0

    monkeypatch.setattr(tpu.subprocess, "run", lambda cmd: calls.append(cmd) or Done())
    out = _run(capsys, ["--command", "ls", "--tpu_name", "t", "--tpu_zone", "z"])
    assert calls == [["gcloud", "compute", "tpus", "tpu-vm", "ssh", "t", "--zone", "z", "--command",
                      "cd /usr/share; ls", "--worker", "all"]]
    assert out == "Successfully setup pod.\n"
    Done.returncode = 3
    with pytest.raises(RuntimeError, match="exited with code 3"):
        _run(capsys, ["--command", "ls", "--tpu_name", "t", "--tpu_zone", "z"])


# ---------------------------------------------------------------------------------------------- as acc subcommands


def _acc(*args):
    from click.testing import CliRunner

    from acc.cli import cli

    return CliRunner().invoke(cli, list(args), prog_name="acc")


def test_acc_to_fsdp2_takes_accelerates_arguments_and_reports_errors_without_a_traceback(tmp_path):
    source = tmp_path / "fsdp1.yaml"
    source.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n"
                      "  fsdp_sharding_strategy: SHARD_GRAD_OP\nmixed_precision: 'no'\nnum_processes: 2\n")
    result = _acc("to-fsdp2", "--config_file", str(source), "--output_file", str(tmp_path / "out.yaml"))
    assert result.exit_code == 0, result.output
    text = (tmp_path / "out.yaml").read_text()
    assert "fsdp_reshard_after_forward: false" in text and "fsdp_version: 2" in text
    missing = _acc("to-fsdp2", "--config-file", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 1 and "nope.yaml not found" in missing.output and "Traceback" not in missing.output


def test_acc_tpu_config_prints_the_gcloud_command_with_debug():
    result = _acc("tpu-config", "--tpu_name", "t", "--tpu_zone", "z", "--command", "ls", "--debug")
    assert result.exit_code == 0, result.output
    assert "Running gcloud compute tpus tpu-vm ssh t --zone z --command cd /usr/share; ls --worker all" in result.output
