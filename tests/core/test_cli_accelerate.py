"""Accelerate's spellings: `accelerate launch` flags and `accelerate config` YAML files, read with Accelerate's
meaning by `acc launch` and `acc config import`; `acc env` carries what `accelerate env` prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from acc.cli import cli
from tests.conftest import ACC, WORKERS, clean_env, read_rank_results, run


def invoke(*args: str, env: dict | None = None, input: str | None = None):
    return CliRunner().invoke(cli, list(args), env=env, input=input, catch_exceptions=False, prog_name="acc")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('trained')\n")
    return path


def settings_table(output: str) -> dict[str, tuple[str, str]]:
    """name -> (value, source) from the dry run's settings table."""
    table = output.split("settings (value, then where it came from):", 1)[1]
    rows = {}
    for line in table.splitlines()[1:]:
        if not line.startswith("  "):
            break
        name, value, source = line.split(None, 2)
        rows[name] = (value, source)
    return rows


def dry(*args: str, env: dict | None = None) -> dict[str, tuple[str, str]]:
    result = invoke("launch", "--dry-run", *args, env=env)
    assert result.exit_code == 0, result.output
    return settings_table(result.output)


def refused(*args: str, env: dict | None = None) -> str:
    result = invoke("launch", "--dry-run", *args, env=env)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return result.output


# ---------------------------------------------------------------------------------------------- flags


@pytest.mark.parametrize("flags,name,value,source", [
    (["--multi_gpu"], "backend", "ddp", "flag --multi_gpu"),
    (["--multi-gpu"], "backend", "ddp", "flag --multi-gpu"),
    (["--use_fsdp"], "backend", "fsdp", "flag --use_fsdp"),
    (["--use-deepspeed"], "backend", "deepspeed", "flag --use-deepspeed"),
    (["--mixed_precision", "bf16"], "mixed_precision", "bf16", "flag --mixed_precision"),
    (["--mixed-precision", "bf16"], "mixed_precision", "bf16", "flag --mixed-precision"),
    (["--mixed_precision=fp16"], "mixed_precision", "fp16", "flag --mixed_precision"),
    (["--gradient_accumulation_steps", "4"], "gradient_accumulation_steps", "4", "flag --gradient_accumulation_steps"),
    (["--cpu"], "cpu", "True", "flag --cpu"),
    (["--multi_gpu", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1"],
     "machine_rank", "1", "flag --machine_rank"),
    (["--multi_gpu", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1"],
     "main_process_ip", "10.0.0.1", "flag --main_process_ip"),
    (["--multi_gpu", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
      "--main_process_port", "29511"], "main_process_port", "29511", "flag --main_process_port"),
    (["--multi_gpu", "--rdzv_backend=c10d"], "rdzv_backend", "c10d", "flag --rdzv_backend"),
    (["--multi_gpu", "--max_restarts", "2"], "max_restarts", "2", "flag --max_restarts"),
    (["--multi_gpu", "--monitor_interval", "0.5"], "monitor_interval", "0.5", "flag --monitor_interval"),
    (["--log_dir", "logs"], "log_dir", "logs", "flag --log_dir"),
    (["--tee", "3"], "tee", "True", "flag --tee"),
    (["--tee"], "tee", "True", "flag --tee"),
    (["-t", "0"], "tee", "False", "flag -t"),
    (["--start_method", "spawn"], "start_method", "spawn", "flag --start_method"),  # acc's own, underscored
    (["--use_deepspeed", "--zero_stage", "3"], "zero_stage", "3", "flag --zero_stage"),
    (["--use_deepspeed", "--zero-stage", "1"], "zero_stage", "1", "flag --zero-stage"),
    (["--use_deepspeed", "--offload_optimizer_device", "cpu"], "offload_optimizer", "cpu",
     "flag --offload_optimizer_device"),
    (["--use_deepspeed", "--zero_stage", "3", "--offload_param_device", "cpu"], "offload_params", "cpu",
     "flag --offload_param_device"),
    (["--use_deepspeed", "--gradient_clipping", "0.5"], "gradient_clipping", "0.5", "flag --gradient_clipping"),
    (["--use_fsdp", "--fsdp_sharding_strategy", "SHARD_GRAD_OP"], "fsdp_strategy", "shard_grad_op",
     "flag --fsdp_sharding_strategy"),
    (["--use_fsdp", "--fsdp_sharding_strategy", "2"], "fsdp_strategy", "shard_grad_op", "flag --fsdp_sharding_strategy"),
    (["--use_fsdp", "--fsdp_reshard_after_forward", "false"], "fsdp_strategy", "shard_grad_op",
     "flag --fsdp_reshard_after_forward"),
    (["--use_fsdp", "--fsdp_offload_params", "true"], "fsdp_cpu_offload", "True", "flag --fsdp_offload_params"),
    (["--use_fsdp", "--fsdp_cpu_offload"], "fsdp_cpu_offload", "True", "flag --fsdp_cpu_offload"),
    (["--use_fsdp", "--fsdp_auto_wrap_policy", "SIZE_BASED_WRAP", "--fsdp_min_num_params", "1000"], "fsdp_wrap",
     "min_params=1000", "flag --fsdp_auto_wrap_policy, flag --fsdp_min_num_params"),
    (["--use_fsdp", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP", "--fsdp_transformer_layer_cls_to_wrap",
      "Block,Head"], "fsdp_wrap", "transformer_layer=Block,Head",
     "flag --fsdp_auto_wrap_policy, flag --fsdp_transformer_layer_cls_to_wrap"),
])
def test_each_accelerate_spelling_sets_acc_s_setting_and_says_so(script, flags, name, value, source):
    rows = dry(*flags, str(script))
    assert rows[name] == (value, source)


def test_tpu_chooses_the_xla_backend(script):
    from acc.assembly.plugins import installed_backends

    result = invoke("launch", "--dry-run", "--tpu", str(script), env={"PJRT_DEVICE": "CPU"})
    if "xla" in installed_backends():  # the xla lane
        assert settings_table(result.output)["backend"] == ("xla", "flag --tpu"), result.output
    else:
        assert result.exit_code == 2
        assert "backend 'xla' is not installed" in result.output and "(backend from flag --tpu)" in result.output


def test_a_dashed_and_an_underscored_spelling_are_the_same_setting(script):
    under = dry("--use_deepspeed", "--zero_stage", "2", "--mixed_precision", "bf16", str(script))
    dashed = dry("--use-deepspeed", "--zero-stage", "2", "--mixed-precision", "bf16", str(script))
    assert {k: v[0] for k, v in under.items()} == {k: v[0] for k, v in dashed.items()}
    assert under["zero_stage"][1] == "flag --zero_stage" and dashed["zero_stage"][1] == "flag --zero-stage"


def test_num_processes_is_the_total_over_all_machines(script):
    result = invoke("launch", "--dry-run", "--multi_gpu", "--num_processes", "4", "--num_machines", "2",
                    "--main_process_ip", "10.0.0.1", str(script))
    assert result.exit_code == 0, result.output
    assert "processes   2 per machine x 2 machine(s) = 4" in result.output
    rows = settings_table(result.output)
    assert rows["nproc"] == ("2", "flag --num_processes (4 over 2 machines)")
    assert rows["num_machines"] == ("2", "flag --num_machines")
    assert dry("--multi_gpu", "--num_processes", "2", str(script))["nproc"] == ("2", "flag --num_processes")
    # num_machines from the environment divides it too
    rows = dry("--num_processes", "6", "--main_process_ip", "10.0.0.1", "--multi_gpu", str(script),
               env={"ACC_NUM_MACHINES": "3"})
    assert rows["nproc"] == ("2", "flag --num_processes (6 over 3 machines)")


def test_num_processes_picks_ddp_on_a_cpu_box_as_nproc_does(script):
    rows = dry("--num_processes", "2", str(script))
    assert rows["backend"] == ("ddp", "detected") and rows["nproc"] == ("2", "flag --num_processes")


def test_a_backend_flag_without_a_count_runs_one_process_per_visible_gpu(script):
    rows = dry("--multi_gpu", str(script), env={"ACC_HARDWARE": '{"cuda": 4}'})
    assert rows["nproc"][0] == "4" and rows["nproc"][1].startswith("detected (--multi_gpu without --num_processes")
    assert dry("--multi_gpu", "--cpu", str(script), env={"ACC_HARDWARE": '{"cuda": 4}'})["nproc"] == ("1", "default")


def test_accepted_flags_with_no_effect(script):
    plain = dry("--multi_gpu", "--num_processes", "2", str(script))
    quiet = dry("--multi_gpu", "--num_processes", "2", "--same_network", "--quiet", "--gpu_ids", "all",
                "--main_training_function", "main", "--main_process_port", "0", str(script))  # 0: a free port
    assert plain == quiet


def test_dynamo_backend_is_the_dynamo_backend_setting(script):
    assert dry("--dynamo_backend", "inductor", str(script))["dynamo_backend"] == ("inductor", "flag --dynamo_backend")


def test_module_and_no_python(tmp_path):
    (tmp_path / "mytrain.py").write_text("")
    result = invoke("launch", "--dry-run", "--module", "mytrain", "--epochs", "2")
    assert result.exit_code == 0 and "command    python -m mytrain --epochs 2" in result.output
    result = invoke("launch", "--dry-run", "--no_python", "echo", "hello")
    assert result.exit_code == 0, result.output
    assert "command    echo hello" in result.output
    out = refused("--no_python", "--module", "echo")
    assert "-m/--module and --no-python exclude each other" in out
    out = refused("--no_python", "no-such-program-xyz")
    assert "program 'no-such-program-xyz' (--no-python) is neither a file nor a command on PATH" in out


def test_launch_help_says_which_accelerate_spellings_work():
    result = invoke("launch", "--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for fragment in ("--num_processes N (total over all machines", "--same_network", "no effect",
                     "--multi_gpu | --use_fsdp | --use_deepspeed | --tpu"):
        assert fragment in text


# ---------------------------------------------------------------------------------------------- bad flags


def test_num_processes_that_does_not_divide_over_the_machines(script):
    out = refused("--multi_gpu", "--num_processes", "3", "--num_machines", "2", "--main_process_ip", "10.0.0.1",
                  str(script))
    assert "flag --num_processes: 3 processes is the total over all machines (Accelerate's meaning)" in out
    assert "does not divide evenly over num_machines = 2 (from flag --num_machines)" in out


@pytest.mark.parametrize("flags,fragments", [
    (["--num_processes", "two"], ["flag --num_processes: expected an integer >= 1", "'two'"]),
    (["--num_processes", "2", "--nproc", "2"], ["--num_processes (the total over all machines", "give one"]),
    (["--multi_gpu", "--use_fsdp"], ["--multi_gpu (ddp), --use_fsdp (fsdp) choose different backends"]),
    (["--mixed_precision", "fp8"], ["flag --mixed_precision: 'fp8' is not supported", "expected one of: no, fp16, bf16"]),
    (["--num_machines", "zero"], ["flag --num_machines: expected an integer >= 1, got 'zero'"]),
    (["--zero_stage", "3"], ["flag --zero_stage sets the deepspeed backend's zero_stage, but the backend is",
                             "--use_deepspeed (or --backend deepspeed)"]),
    (["--use_deepspeed", "--zero_stage", "5"], ["flag --zero_stage: expected an integer from 0 to 3, got '5'"]),
    (["--use_deepspeed", "--offload_optimizer_device", "nvme"],
     ["flag --offload_optimizer_device: expected one of: none, cpu, got 'nvme'"]),
    (["--fsdp_offload_params", "true"], ["flag --fsdp_offload_params sets the fsdp backend's fsdp_cpu_offload",
                                         "--use_fsdp (or --backend fsdp)"]),
    (["--use_fsdp", "--fsdp_sharding_strategy", "NO_SHARD"], ["NO_SHARD is not supported", "--multi_gpu"]),
    (["--use_fsdp", "--fsdp_transformer_layer_cls_to_wrap", "Block"],
     ["flag --fsdp_transformer_layer_cls_to_wrap", "TRANSFORMER_BASED_WRAP"]),
    (["--use_fsdp", "--fsdp_state_dict_type", "LOCAL_STATE_DICT"], ["flag --fsdp_state_dict_type", "SHARDED_STATE_DICT"]),
    (["--tee", "1"], ["flag --tee 1", "use --tee 3"]),
    (["--dynamo_mode", "max-autotune"], ["Accelerate's --dynamo_mode is not supported", "torch.compile"]),
    (["--use_megatron_lm"], ["Accelerate's --use_megatron_lm is not supported", "fsdp (--use_fsdp)"]),
    (["--fp8_backend", "te"], ["Accelerate's --fp8_backend is not supported", "no, fp16 or bf16"]),
    (["--num_cpu_threads_per_process", "4"], ["--num_cpu_threads_per_process is not supported", "OMP_NUM_THREADS"]),
    (["--gpu_ids", "0,1"], ["--gpu_ids 0,1 is not supported", "CUDA_VISIBLE_DEVICES"]),
    (["--deepspeed_hostfile", "hosts"], ["--deepspeed_hostfile is not supported", "on each machine"]),
    (["--debug"], ["Accelerate's --debug is not supported", "ACC_DEBUG=1"]),
    (["--use_deepspeed", "--zero3_init_flag", "true"], ["--zero3_init_flag true is not supported", "deepspeed.zero.Init"]),
])
def test_bad_or_unsupported_accelerate_flags_are_clear_errors(script, flags, fragments):
    out = refused(*flags, str(script))
    for fragment in fragments:
        assert fragment in out, out
    assert "No such option" not in out


# Every option of `accelerate launch` (Accelerate 1.x, src/accelerate/commands/launch.py), True = takes no value.
ACCELERATE_OPTIONS = {
    "--config_file": False, "--quiet": True, "--cpu": True, "--multi_gpu": True, "--tpu": True,
    "--mixed_precision": False, "--num_processes": False, "--num_machines": False,
    "--num_cpu_threads_per_process": False, "--enable_cpu_affinity": True, "--dynamo_backend": False,
    "--dynamo_mode": False, "--dynamo_use_fullgraph": True, "--dynamo_use_dynamic": True,
    "--dynamo_use_regional_compilation": True, "--use_deepspeed": True, "--use_fsdp": True,
    "--use_parallelism_config": True, "--use_megatron_lm": True, "--gpu_ids": False, "--same_network": True,
    "--machine_rank": False, "--main_process_ip": False, "--main_process_port": False, "--tee": False,
    "--log_dir": False, "--role": False, "--rdzv_backend": False, "--rdzv_conf": False, "--max_restarts": False,
    "--monitor_interval": False, "--module": True, "--no_python": True, "--tpu_cluster": True,
    "--no_tpu_cluster": True, "--tpu_use_sudo": True, "--vm": False, "--env": False, "--main_training_function": False,
    "--downcast_bf16": True, "--deepspeed_config_file": False, "--zero_stage": False,
    "--offload_optimizer_device": False, "--offload_param_device": False, "--offload_optimizer_nvme_path": False,
    "--offload_param_nvme_path": False, "--gradient_accumulation_steps": False, "--gradient_clipping": False,
    "--zero3_init_flag": False, "--zero3_save_16bit_model": False, "--deepspeed_hostfile": False,
    "--deepspeed_exclusion_filter": False, "--deepspeed_inclusion_filter": False,
    "--deepspeed_multinode_launcher": False, "--deepspeed_moe_layer_cls_names": False, "--fsdp_version": False,
    "--fsdp_offload_params": False, "--fsdp_min_num_params": False, "--fsdp_sharding_strategy": False,
    "--fsdp_reshard_after_forward": False, "--fsdp_auto_wrap_policy": False,
    "--fsdp_transformer_layer_cls_to_wrap": False, "--fsdp_backward_prefetch": False, "--fsdp_state_dict_type": False,
    "--fsdp_forward_prefetch": False, "--fsdp_use_orig_params": False, "--fsdp_cpu_ram_efficient_loading": False,
    "--fsdp_sync_module_states": False, "--fsdp_activation_checkpointing": False,
    "--fsdp_activation_checkpointing_offload": False,
    **{f"--megatron_lm_{n}": False for n in (
        "tp_degree", "use_custom_fsdp", "no_load_optim", "eod_mask_loss", "overlap_cpu_optimizer_d2h_h2d",
        "no_save_optim", "optimizer_cpu_offload", "use_precision_aware_optimizer", "decoder_last_pipeline_num_layers",
        "pp_degree", "num_micro_batches", "sequence_parallelism", "recompute_activations", "use_distributed_optimizer",
        "gradient_clipping", "recompute_granularity", "recompute_method", "recompute_num_layers", "attention_backend",
        "expert_model_parallel_size", "context_parallel_size", "attention_dropout", "hidden_dropout",
        "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
        "use_rotary_position_embeddings")},
    "--fp8_backend": False, "--fp8_use_autocast_during_eval": True,
    **{f"--fp8_{n}": False for n in ("margin", "interval", "format", "amax_history_len", "amax_compute_algo",
                                     "override_linear_precision", "opt_level", "enable_fsdp_float8_all_gather",
                                     "pad_inner_dim")},
    "--aws_access_key_id": False, "--aws_secret_access_key": False, "--debug": True, "--mpirun_hostfile": False,
    **{f"--parallelism_config_{n}": False for n in (
        "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "cp_comm_strategy", "sp_size",
        "sp_backend", "sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")},
}
# values that make sense for an option acc honours (the rest get "1": accepted or a clear error, either way)
GOOD_VALUES = {"--mixed_precision": "bf16", "--main_process_ip": "127.0.0.1", "--main_process_port": "29517",
               "--machine_rank": "0", "--rdzv_backend": "c10d", "--log_dir": "logs", "--tee": "3",
               "--dynamo_backend": "no", "--gpu_ids": "all", "--main_training_function": "main",
               "--fsdp_version": "2", "--fsdp_sharding_strategy": "FULL_SHARD", "--zero3_save_16bit_model": "true"}


def test_the_list_has_all_of_accelerate_s_options():
    # 123 options + -h/--help + the script and its arguments: the 126 add_argument calls of Accelerate 1.15's
    # launch_command_parser (a grep for "add_argument(" finds 128 lines: two are its help formatter's own method)
    assert len(ACCELERATE_OPTIONS) == 123


def test_acc_commands_launch_parser_has_the_same_options_taking_values_as_accelerates():
    from acc.compat.accelerate_launch_options import all_options

    assert {f"--{o.name}": o.kind == "flag" for o in all_options()} == ACCELERATE_OPTIONS


@pytest.mark.parametrize("option", [o for o in ACCELERATE_OPTIONS if o not in ("--config_file", "--module",
                                                                               "--no_python")])
def test_every_accelerate_option_is_known_to_acc_launch(script, option):
    """Each is honoured (exit 0) or refused with a message naming it; never click's bare 'No such option'."""
    args = [option] if ACCELERATE_OPTIONS[option] else [option, GOOD_VALUES.get(option, "1")]
    result = invoke("launch", "--dry-run", *args, str(script))
    assert "No such option" not in result.output and "Traceback" not in result.output, result.output
    if result.exit_code != 0:
        assert result.exit_code == 2 and option in result.output, result.output


# ---------------------------------------------------------------------------------------------- YAML configs

DDP_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
enable_cpu_affinity: false
gpu_ids: all
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

FSDP_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: false
  fsdp_offload_params: true
  fsdp_reshard_after_forward: false
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
use_cpu: false
"""

DEEPSPEED_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 4
  gradient_clipping: 1.0
  offload_optimizer_device: cpu
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 2
distributed_type: DEEPSPEED
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
use_cpu: false
"""

EXPECTED = {
    "ddp": (DDP_YAML, {"backend": "ddp", "nproc": "2", "mixed_precision": "bf16", "cpu": "False",
                       "rdzv_backend": "c10d"}),
    "fsdp": (FSDP_YAML, {"backend": "fsdp", "nproc": "2", "mixed_precision": "bf16", "fsdp_strategy": "shard_grad_op",
                         "fsdp_wrap": "transformer_layer=Block", "fsdp_cpu_offload": "True"}),
    "deepspeed": (DEEPSPEED_YAML, {"backend": "deepspeed", "nproc": "2", "zero_stage": "2", "offload_optimizer": "cpu",
                                   "offload_params": "none", "gradient_clipping": "1.0",
                                   "gradient_accumulation_steps": "4"}),
}


@pytest.mark.parametrize("kind", list(EXPECTED))
@pytest.mark.parametrize("spelling", ["--config_file", "--config-file"])
def test_launch_reads_an_accelerate_yaml_config(tmp_path, script, kind, spelling):
    text, expected = EXPECTED[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    rows = dry(spelling, str(path), str(script))
    for name, value in expected.items():
        source = "default" if name == "rdzv_backend" else f"config file {path}"  # static on one machine: acc's own
        assert rows[name] == (value, source), name


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_config_import_round_trip(tmp_path, script, kind):
    text, expected = EXPECTED[kind]
    source = tmp_path / f"{kind}.yaml"
    source.write_text(text)
    out = tmp_path / f"{kind}.toml"
    result = invoke("config", "import", str(source), "--config-file", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    assert out.read_text().startswith(f"# converted by `acc config import` from {source}")
    from_yaml = dry("--config-file", str(source), str(script))
    from_toml = dry("--config-file", str(out), str(script))
    assert {k: v[0] for k, v in from_yaml.items()} == {k: v[0] for k, v in from_toml.items()}
    for name, value in expected.items():
        assert from_toml[name][0] == value, name
        if name != "rdzv_backend":
            assert from_toml[name][1] == f"config file {out}"


def test_config_import_writes_the_project_file_and_refuses_an_acc_toml(tmp_path):
    (tmp_path / "a.yaml").write_text(DDP_YAML)
    result = invoke("config", "import", "a.yaml", "--project")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "acc.toml").read_text()
    assert 'backend = "ddp"' in text and "nproc = 2" in text and 'mixed_precision = "bf16"' in text
    result = invoke("config", "import", "acc.toml", "--config-file", "x.toml")
    assert result.exit_code == 2 and "is not an Accelerate config" in result.output
    assert not (tmp_path / "x.toml").exists()


def test_a_yaml_config_is_recognised_by_its_content(tmp_path, script):
    (tmp_path / "accelerate.cfg").write_text(DDP_YAML)
    assert dry("--config-file", "accelerate.cfg", str(script))["backend"] == ("ddp", "config file accelerate.cfg")


def test_flags_override_the_yaml_config_and_num_machines_divides_its_total(tmp_path, script):
    (tmp_path / "a.yaml").write_text(DDP_YAML.replace("num_processes: 2", "num_processes: 4"))
    rows = dry("--config_file", "a.yaml", "--mixed_precision", "no", "--num_machines", "2", "--main_process_ip",
               "10.0.0.1", str(script))
    assert rows["mixed_precision"] == ("no", "flag --mixed_precision")
    assert rows["nproc"] == ("2", "config file a.yaml (num_processes 4 over 2 machines)")


def test_a_multi_machine_yaml_config(tmp_path, script):
    (tmp_path / "m.yaml").write_text("distributed_type: MULTI_GPU\nmachine_rank: 1\nmain_process_ip: 10.0.0.1\n"
                                     "main_process_port: 29555\nnum_machines: 2\nnum_processes: 8\n"
                                     "rdzv_backend: static\nsame_network: false\n")
    result = invoke("launch", "--dry-run", "--config_file", "m.yaml", str(script))
    assert result.exit_code == 0, result.output
    assert "processes   4 per machine x 2 machine(s) = 8, this is machine 1" in result.output
    assert "rendezvous  static at 10.0.0.1:29555" in result.output


def test_an_fsdp1_config_is_read_as_accelerate_converts_it_to_fsdp2(tmp_path, script):
    (tmp_path / "f.yaml").write_text(
        "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
        "  fsdp_backward_prefetch: BACKWARD_PRE\n  fsdp_use_orig_params: true\n  fsdp_sync_module_states: true\n")
    result = invoke("launch", "--dry-run", "--config_file", "f.yaml", str(script))
    assert result.exit_code == 0, result.output
    assert settings_table(result.output)["fsdp_strategy"][0] == "full_shard"
    assert settings_table(result.output)["fsdp_from_rank0"][0] == "True"  # sync_module_states: rank 0's weights
    assert "fsdp_backward_prefetch has no effect: FSDP2, which acc's fsdp backend runs" in result.output


TP_HSDP_YAML = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_version: 2
mixed_precision: bf16
num_machines: 1
num_processes: 8
parallelism_config:
  parallelism_config_cp_size: 1
  parallelism_config_dp_replicate_size: 2
  parallelism_config_dp_shard_size: 2
  parallelism_config_tp_size: 2
rdzv_backend: static
"""


def test_the_parallelism_config_of_accelerates_tp_hsdp_example_config_gives_the_mesh(tmp_path, script):
    # examples/torch_native_parallelism/configs/tp_hsdp.yaml as Accelerate ships it (tp x dp_shard x dp_replicate)
    path = tmp_path / "tp_hsdp.yaml"
    path.write_text(TP_HSDP_YAML)
    result = invoke("launch", "--dry-run", "--config_file", str(path), str(script))
    assert result.exit_code == 0, result.output
    rows = settings_table(result.output)
    for dim, size in (("dp_replicate", "2"), ("dp_shard", "2"), ("tp", "2"), ("cp", "1")):
        assert rows[f"mesh_{dim}_size"] == (size, f"config file {path}"), dim
    assert rows["fsdp_wrap"][0] == "no_split_modules"  # TRANSFORMER_BASED_WRAP without classes, as Accelerate
    assert "mesh        dp_replicate 2 x dp_shard 2 x tp 2 (outermost first)" in result.output
    short = path.with_name("short.yaml")
    short.write_text(TP_HSDP_YAML.replace("num_processes: 8", "num_processes: 4"))
    refused = invoke("launch", "--dry-run", "--config_file", str(short), str(script))
    assert refused.exit_code == 2 and "= 8 processes, but this run has 4" in refused.output


def test_the_workers_get_the_mesh_sizes_as_accelerates_launcher_hands_them():
    from acc.launcher.orchestrate import parallelism_environment

    assert parallelism_environment({"mesh_tp_size": 2, "mesh_dp_shard_size": None}) == {
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "1", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "1",
        "PARALLELISM_CONFIG_TP_SIZE": "2", "PARALLELISM_CONFIG_CP_SIZE": "1", "PARALLELISM_CONFIG_SP_SIZE": "1"}
    assert parallelism_environment({}) == {}


@pytest.mark.parametrize("text,fragments", [
    ("distributed_type: FSDP\nparallelism_config:\n  parallelism_config_tp_sise: 2\n",
     ["unknown key 'parallelism_config.parallelism_config_tp_sise' (did you mean 'parallelism_config_tp_size'?)"]),
    ("distributed_type: FSDP\nparallelism_config:\n  parallelism_config_tp_size: 0\n",
     ["key 'parallelism_config.parallelism_config_tp_size': expected an integer >= 1, got 0"]),
    ("distributed_type: FSDP\nparallelism_config:\n  parallelism_config_cp_comm_strategy: alltoall\n",
     ["'alltoall' is not supported", "PARALLELISM_CONFIG_CP_COMM_STRATEGY=alltoall"]),
    ("distributed_type: MULTI_GPU\nnum_processes: 2\nnum_procs: 3\n",
     ["line 3: unknown key 'num_procs' (did you mean 'num_processes'?)"]),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stag: 2\n",
     ["line 3: unknown key 'deepspeed_config.zero_stag' (did you mean 'zero_stage'?)"]),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_wrap_everything: true\n", ["unknown key 'fsdp_config.fsdp_wrap_everything'"]),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 5\n",
     ["line 3: key 'deepspeed_config.zero_stage' (acc's zero_stage): expected an integer from 0 to 3, got 5"]),
    ("distributed_type: MULTI_GPU\nnum_processes: 3\nnum_machines: 2\nmain_process_ip: 10.0.0.1\n",
     ["key 'num_processes': 3 processes is the total over all machines", "num_machines = 2"]),
    ("distributed_type: MULTI_XPU\n", ["key 'distributed_type': MULTI_XPU is not supported", "no backend for XPU"]),
    ("num_processes: 2\n", ["needs a distributed_type"]),
    ("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: MULTI_GPU\nec2_instance_type: ml.p3.2xlarge\n",
     ["AMAZON_SAGEMAKER is not supported", "SageMaker"]),
    ("distributed_type: MULTI_GPU\ngpu_ids: 0,1\n", ["key 'gpu_ids'", "CUDA_VISIBLE_DEVICES=0,1"]),
    ("distributed_type: MULTI_GPU\ndynamo_config:\n  dynamo_backend: INDUCTOR\n", ["key 'dynamo_config'", "torch.compile"]),
    ("distributed_type: [MULTI_GPU\n", ["not valid YAML"]),
])
def test_bad_yaml_configs_are_clear_errors(tmp_path, script, text, fragments):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    for command in (["launch", "--dry-run", "--config_file", str(path), str(script)],
                    ["config", "import", str(path), "--config-file", str(tmp_path / "out.toml")]):
        result = invoke(*command)
        assert result.exit_code == 2, result.output
        assert f"config file {path}" in result.output
        for fragment in fragments:
            assert fragment in result.output, result.output
        assert not (tmp_path / "out.toml").exists()


def test_a_missing_config_file(tmp_path, script):
    out = refused("--config_file", "nope.yaml", str(script))
    assert "config file nope.yaml does not exist" in out
    result = invoke("config", "import", "nope.yaml")
    assert result.exit_code == 2 and "config file nope.yaml does not exist" in result.output


def test_reading_yaml_without_pyyaml_says_how_to_install_it(tmp_path, script, monkeypatch):
    (tmp_path / "a.yaml").write_text(DDP_YAML)
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` now fails as if it were not installed
    out = refused("--config_file", "a.yaml", str(script))
    assert "reading it needs PyYAML, which is not installed: pip install pyyaml" in out


def test_pyyaml_is_imported_only_when_a_yaml_file_is_read(tmp_path, script):
    code = ("import sys\nfrom acc.cli import main\n"
            f"try:\n    main(['launch', '--dry-run', '--multi_gpu', '--num_processes', '2', {str(script)!r}])\n"
            "except SystemExit:\n    pass\nprint('LOADED', 'yaml' in sys.modules, 'torch' in sys.modules)\n")
    proc = run([sys.executable, "-c", code], tmp_path)
    assert "LOADED False False" in proc.stdout, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------- acc config


def test_every_config_subcommand_takes_the_file_options(tmp_path):
    target = tmp_path / "elsewhere" / "c.toml"
    result = invoke("config", "default", "--config-file", str(target))
    assert result.exit_code == 0, result.output
    assert f"wrote {target}" in result.output and 'backend = "cpu"' in target.read_text()
    assert not (tmp_path / "user-config" / "config.toml").exists()
    result = invoke("config", "default", "--project")
    assert result.exit_code == 0 and (tmp_path / "acc.toml").is_file()
    target.write_text('backend = "ddp"\nnproc = 2\n')
    shown = invoke("config", "show", "--config_file", str(target))
    assert shown.exit_code == 0, shown.output
    assert settings_table(shown.output)["nproc"] == ("2", f"config file {target}")
    result = invoke("config", "default", "--config-file", "x.toml", "--project")
    assert result.exit_code == 2 and "give either --config-file or --project, not both" in result.output


# ---------------------------------------------------------------------------------------------- acc env


def test_env_has_what_accelerate_env_prints(tmp_path):
    (tmp_path / "a.yaml").write_text(DEEPSPEED_YAML)
    proc = run([ACC, "env", "--config_file", "a.yaml"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    import numpy
    import torch

    lines = {line[:25].strip(): line[25:].strip() for line in proc.stdout.splitlines() if line.startswith("  ")}
    assert lines["numpy"] == numpy.__version__ and lines["torch"] == torch.__version__
    assert lines["torch accelerator"] == ("CUDA" if torch.cuda.is_available() else "N/A")
    assert lines["system RAM"].endswith(" GB") and float(lines["system RAM"].split()[0]) > 0
    assert lines["platform"] and lines["python"].startswith(sys.version.split()[0])
    assert lines["acc location"].endswith("acc")
    assert lines["files"] == "a.yaml (config file)" and lines["zero_stage"] == "2  (config file a.yaml)"


# ---------------------------------------------------------------------------------------------- real launches


@pytest.mark.slow
def test_multi_gpu_num_processes_cpu_trains_on_two_ddp_processes(tmp_path):
    out = tmp_path / "out"
    proc = run([ACC, "launch", "--multi_gpu", "--num_processes", "2", "--cpu", "--output-dir", "",
                str(WORKERS / "train_mlp.py"), "--out", str(out), "--batch", "8"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    ranks = read_rank_results(out)
    assert sorted(ranks) == [0, 1]
    for rank in ranks.values():
        assert rank["world"] == 2 and rank["backend"] == "ddp" and rank["device"] == "cpu"
    assert ranks[0]["weights"] == ranks[1]["weights"]  # gradients were averaged across the two processes
    seen = [set(i for batch in ranks[r]["seen"] for i in batch) for r in (0, 1)]
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(64))  # each sample on exactly one process


@pytest.mark.slow
def test_no_python_runs_a_program_on_every_process(tmp_path):
    program = tmp_path / "report.sh"
    program.write_text('#!/bin/sh\necho "$RANK $WORLD_SIZE $1" > "$2/rank$RANK"\n')
    program.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    proc = run([ACC, "launch", "--multi_gpu", "--num_processes", "2", "--cpu", "--no_python", "--output-dir", "",
                str(program), "hello", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.read_text().strip() for p in out.iterdir()) == ["0 2 hello", "1 2 hello"]
    proc = run([ACC, "launch", "--no_python", "--output-dir", "", str(program), "single", str(out)], tmp_path,
               env=clean_env(tmp_path, RANK="7"))
    assert proc.returncode == 0, proc.stderr
    assert (out / "rank7").read_text().strip() == "7  single"  # one plain process: the program itself


def test_monitor_interval_reaches_the_elastic_agent(tmp_path, script):
    from acc.assembly.choose import assemble
    from acc.launcher import elastic
    from acc.launcher.plans import elastic_plan

    settings = assemble(flags={"backend": "ddp", "nproc": "2", "monitor_interval": "0.7"}).settings
    assert elastic._monitor_interval({"ACC_LAUNCH": settings.to_json()}) == 0.7
    assert elastic._monitor_interval({}) == 0.1  # torchrun's and Accelerate's default
    config = elastic.launch_config(elastic_plan(settings, "cpu"), str(tmp_path), False, "spawn", 0.7)
    assert config.monitor_interval == 0.7
    rows = dry("--multi_gpu", "--monitor_interval", "0.7", str(script))
    assert rows["monitor_interval"] == ("0.7", "flag --monitor_interval")
    out = refused("--monitor_interval", "0", str(script))
    assert "flag --monitor_interval: expected a number >= 0.01, got '0'" in out


def test_the_launch_records_the_spelling_typed(tmp_path):
    (tmp_path / "echo_env.py").write_text(
        "import json, os\nprint(json.dumps(json.loads(os.environ['ACC_LAUNCH'])['sources']))\n")
    proc = run([ACC, "launch", "--mixed_precision", "bf16", "--output-dir", "", "echo_env.py"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mixed_precision"] == "flag --mixed_precision"


def test_the_translation_keeps_the_script_and_its_arguments(script):
    result = invoke("launch", "--dry-run", "--multi_gpu", "--num_processes", "2", str(script), "--num_processes", "9",
                    "--tee", "3", "--multi_gpu")
    assert result.exit_code == 0, result.output
    assert f"command     python {script} --num_processes 9 --tee 3 --multi_gpu" in result.output
