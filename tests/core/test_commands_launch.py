"""acc.commands.launch (Accelerate's launch parser and launch_command, run through `acc launch`) and acc.utils.launch
(the command and environment Accelerate's launchers compute)."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import textwrap

import pytest

from acc.commands.launch import _validate_launch_command, acc_launch_argv, launch_command, launch_command_parser
from acc.compat.accelerate_launch import FLAGS
from acc.compat.accelerate_launch_options import all_options
from acc.utils.launch import (
    _convert_nargs_to_dict,
    _filter_args,
    env_var_path_add,
    prepare_multi_gpu_env,
    prepare_simple_launcher_cmd_env,
)

PARSER = launch_command_parser()


def test_every_accelerate_launch_option_is_parsed_and_read_by_acc_launch():
    # the parser's options and the ones `acc launch` knows how to read are one set
    assert {o.name for o in all_options()} == set(FLAGS)


@pytest.mark.parametrize("spelling", ["underscore", "hyphen"])
def test_both_spellings_parse_to_accelerates_fields(spelling):
    def opt(name):
        return "--" + (name.replace("_", "-") if spelling == "hyphen" else name)

    args = PARSER.parse_args([opt("multi_gpu"), opt("num_processes"), "4", opt("fsdp_sync_module_states"), "false",
                              "train.py", "--lr", "1"])
    assert args.multi_gpu is True and args.num_processes == 4 and args.fsdp_sync_module_states == "false"
    assert args.training_script == "train.py" and args.training_script_args == ["--lr", "1"]
    assert args.nondefault == {"multi_gpu", "num_processes", "fsdp_sync_module_states"}


def test_defaults_are_accelerates():
    args = PARSER.parse_args(["train.py"])
    assert (args.tee, args.rdzv_backend, args.max_restarts, args.monitor_interval) == ("0", "static", 0, 0.1)
    assert (args.fsdp_version, args.fsdp_sync_module_states, args.fsdp_min_num_params) == ("1", "true", 100_000_000)
    assert args.tpu_use_cluster is False and args.fp8_override_linear_precision == (False, False, False)
    assert not hasattr(args, "nondefault")


def test_help_lists_each_option_once_in_its_underscore_spelling():
    text = PARSER.format_help()
    for option in all_options():
        if "_" in option.name:
            assert f"--{option.name.replace('_', '-')}" not in text.replace("--num-processes=2", "")
    assert text.count("--num-processes") == 1  # the description's example of the hyphen spelling


def test_no_tpu_cluster_clears_what_tpu_cluster_sets():
    assert PARSER.parse_args(["--tpu_cluster", "t.py"]).tpu_use_cluster is True
    assert PARSER.parse_args(["--tpu_cluster", "--no_tpu_cluster", "t.py"]).tpu_use_cluster is False


def test_the_acc_launch_arguments_are_the_given_options_in_accelerates_spelling():
    args = PARSER.parse_args(["--num-processes", "2", "--multi_gpu", "--mixed_precision", "bf16", "--vm", "a",
                              "--vm", "b", "-m", "pkg.train", "--epochs", "3"])
    assert acc_launch_argv(args) == ["--multi_gpu", "--mixed_precision=bf16", "--num_processes=2", "--module",
                                     "--vm=a", "--vm=b", "pkg.train", "--epochs", "3"]
    # what comes out parses back to the same values
    again = PARSER.parse_args(acc_launch_argv(args))
    assert {k: getattr(again, k) for k in args.nondefault} == {k: getattr(args, k) for k in args.nondefault}


def test_a_namespace_built_by_hand_hands_over_what_differs_from_the_defaults():
    args = PARSER.parse_args(["t.py"])  # no option given: no record of given ones
    args.num_processes, args.use_fsdp = 3, True
    assert acc_launch_argv(args) == ["--num_processes=3", "--use_fsdp", "t.py"]


# ---------------------------------------------------------------------------------------------- validation


def test_validation_refuses_two_backends_and_a_one_process_multi_gpu_run():
    with pytest.raises(ValueError, match="--multi_gpu, --cpu were given"):
        _validate_launch_command(PARSER.parse_args(["--multi_gpu", "--cpu", "t.py"]))
    with pytest.raises(ValueError, match="at least 2 processes"):
        _validate_launch_command(PARSER.parse_args(["--multi_gpu", "--num_processes", "1", "t.py"]))


def test_validation_without_a_config_file_fills_accelerates_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no default config file
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    args, defaults, from_config = _validate_launch_command(PARSER.parse_args(["t.py"]))
    assert defaults is None and from_config is False
    assert (args.num_machines, args.mixed_precision, args.dynamo_backend, args.debug) == (1, "no", "no", False)
    assert args.num_processes == 0  # the CUDA devices here (Accelerate counts them too)
    assert args.num_cpu_threads_per_process == 1


def test_validation_takes_a_config_files_values_for_what_was_not_given(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(textwrap.dedent("""\
        compute_environment: LOCAL_MACHINE
        debug: true
        distributed_type: FSDP
        mixed_precision: bf16
        num_machines: 1
        num_processes: 4
        fsdp_config:
          fsdp_sync_module_states: false
          fsdp_offload_params: true
        """))
    args = PARSER.parse_args(["--num-processes", "2", "--fsdp_offload_params", "false", "--config-file", str(config),
                              "t.py"])
    args, defaults, from_config = _validate_launch_command(args)
    assert defaults is not None and from_config is True
    assert args.use_fsdp is True and args.debug is True and args.mixed_precision == "bf16"
    assert args.num_processes == 2  # given: kept
    assert args.fsdp_sync_module_states is False  # not given: the file's
    assert args.fsdp_offload_params == "false"  # given: kept


# ---------------------------------------------------------------------------------------------- launching


SCRIPT = """\
import json, os, sys
from acc import Accelerator
acc = Accelerator()
out = sys.argv[1]
with open(f"{out}.{acc.process_index}", "w") as f:
    json.dump({"n": acc.num_processes, "precision": acc.mixed_precision, "args": sys.argv[2:]}, f)
if "--fail" in sys.argv:
    sys.exit(3)
"""


def test_launch_command_runs_the_script_with_acc_launch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    launch_command(PARSER.parse_args(["--cpu", "--monitor_interval", "0.1", str(script), str(out), "--x", "1"]))
    assert json.loads((tmp_path / "out.0").read_text()) == {"n": 1, "precision": "no", "args": ["--x", "1"]}


def test_launch_command_starts_the_processes_accelerates_options_ask_for(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    launch_command(PARSER.parse_args(["--multi_gpu", "--num_processes", "2", "--main_process_port", "0",
                                      str(script), str(tmp_path / "out")]))
    assert [json.loads((tmp_path / f"out.{r}").read_text())["n"] for r in (0, 1)] == [2, 2]


def test_a_failing_run_raises_called_process_error_or_exits_1_when_quiet(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with pytest.raises(subprocess.CalledProcessError) as failed:
        launch_command(PARSER.parse_args(["--cpu", str(script), str(tmp_path / "out"), "--fail"]))
    assert failed.value.returncode != 0 and failed.value.cmd[1:4] == ["-m", "acc", "launch"]
    with pytest.raises(SystemExit) as quiet:
        launch_command(PARSER.parse_args(["--quiet", "--cpu", str(script), str(tmp_path / "out"), "--fail"]))
    assert quiet.value.code == 1


def test_an_option_acc_cannot_honour_is_refused_naming_it(tmp_path, capfd):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with pytest.raises(subprocess.CalledProcessError):
        launch_command(PARSER.parse_args(["--role", "trainer", str(script), str(tmp_path / "out")]))
    assert "--role" in capfd.readouterr().err
    assert not (tmp_path / "out.0").exists()


# ---------------------------------------------------------------------------------------------- acc.utils.launch


def _validated(*argv):
    args, _, _ = _validate_launch_command(PARSER.parse_args([*argv, "t.py", "--a", "1"]))
    return args


def test_the_simple_launcher_sets_intel_openmp_variables_on_cpu_only(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    for name in ("KMP_AFFINITY", "KMP_BLOCKTIME"):
        monkeypatch.delenv(name, raising=False)
    cmd, env = prepare_simple_launcher_cmd_env(_validated("--cpu"))
    assert cmd == [sys.executable, "t.py", "--a", "1"]
    assert (env["KMP_AFFINITY"], env["KMP_BLOCKTIME"], env["ACCELERATE_USE_CPU"]) == \
        ("granularity=fine,compact,1,0", "1", "True")
    _, env = prepare_simple_launcher_cmd_env(_validated())
    assert "KMP_AFFINITY" not in env and "KMP_BLOCKTIME" not in env


def test_the_simple_launcher_command_for_modules_programs_and_its_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert prepare_simple_launcher_cmd_env(_validated("-m"))[0] == [sys.executable, "-m", "t.py", "--a", "1"]
    assert prepare_simple_launcher_cmd_env(_validated("--no_python"))[0] == ["t.py", "--a", "1"]
    with pytest.raises(ValueError, match="--module and --no_python"):
        prepare_simple_launcher_cmd_env(_validated("-m", "--no_python"))
    _, env = prepare_simple_launcher_cmd_env(_validated("--mixed_precision", "bf16", "--dynamo_backend", "inductor",
                                                        "--gpu_ids", "1", "--num_processes", "2"))
    assert (env["ACCELERATE_MIXED_PRECISION"], env["ACCELERATE_DYNAMO_BACKEND"], env["CUDA_VISIBLE_DEVICES"]) == \
        ("bf16", "INDUCTOR", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29500")


def test_the_multi_gpu_environment_picks_a_free_port_for_port_0(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    args = _validated("--use_fsdp", "--num_processes", "2", "--main_process_port", "0")
    env = prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0" and args.nproc_per_node == "2"
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_SYNC_MODULE_STATES"] == "true"


def test_a_port_in_use_turns_a_one_machine_run_standalone(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        args = _validated("--num_processes", "2", "--main_process_port", str(port))
        with pytest.warns(UserWarning, match=f"Port `{port}` is already in use"):
            prepare_multi_gpu_env(args)
    assert args.standalone is True


def test_script_arguments_convert_to_typed_values_and_a_bare_flag_is_refused():
    converted = _convert_nargs_to_dict(["--name", "bert", "--do_train", "False", "--epochs", "3", "--lr", "5e-5",
                                        "--steps", "50.5"])
    assert converted == {"name": "bert", "do_train": False, "epochs": 3, "lr": 5e-5, "steps": 50.5}
    with pytest.raises(ValueError, match="--do_train has no value"):
        _convert_nargs_to_dict(["--do_train", "--epochs", "3"])


def test_path_variables_and_argument_filtering(monkeypatch):
    monkeypatch.setenv("ACC_TEST_PATH", "/a:/b")
    assert env_var_path_add("ACC_TEST_PATH", "/c") == "/a:/b:/c"
    small = argparse.ArgumentParser()
    small.add_argument("--num_processes", type=int, default=1)
    filtered = _filter_args(PARSER.parse_args(["--num_processes", "3", "t.py"]), small)
    assert vars(filtered) == {"num_processes": 3}


def _record_env(out):
    import os

    with open(out, "w") as f:
        json.dump({k: os.environ.get(k) for k in ("LOCAL_RANK", "RANK", "FORK_LAUNCHED")}, f)


def test_prepare_for_launch_sets_the_ranks_of_a_forked_process(monkeypatch, tmp_path):
    import pickle

    from acc.utils import PrepareForLaunch

    monkeypatch.setenv("NPROC", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    for name in ("LOCAL_RANK", "RANK", "FORK_LAUNCHED"):
        monkeypatch.delenv(name, raising=False)
    prepared = pickle.loads(pickle.dumps(PrepareForLaunch(_record_env, distributed_type="MULTI_CPU")))
    prepared(1, str(tmp_path / "env.json"))
    assert json.loads((tmp_path / "env.json").read_text()) == {"LOCAL_RANK": "1", "RANK": "3", "FORK_LAUNCHED": "1"}


def test_prepare_pippy_cuts_by_size_outside_no_split_classes_and_pads_to_the_micro_batches():
    import torch
    from torch import nn

    from acc import prepare_pippy
    from acc.big_model.pipeline import auto_split_points, pad_rows

    class Pair(nn.Sequential):
        pass

    model = nn.Sequential(nn.Linear(4, 64), Pair(nn.Linear(64, 64), nn.Linear(64, 64)), nn.Linear(64, 4))
    assert auto_split_points(model, 2) == ["1.1"]  # an even cut by size: 1.3 KB + 16.6 KB | 16.6 KB + 1.0 KB
    assert auto_split_points(model, 2, ["Pair"]) == ["1"]  # never inside a Pair
    assert auto_split_points(model, 3) == ["1.0", "1.1"]
    padded = pad_rows((torch.ones(3, 2), {"mask": torch.ones(3)}), 3, 2)
    assert padded[0].shape == (4, 2) and padded[0][3].tolist() == [0.0, 0.0] and padded[1]["mask"].shape == (4,)
    single = nn.Linear(2, 2)
    assert prepare_pippy(single) is single and single.hf_split_points == []  # one process: one stage, the model
