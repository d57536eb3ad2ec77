"""What Accelerate's launchers compute from a `launch_command_parser` Namespace (public path `acc.utils.launch`):
`prepare_simple_launcher_cmd_env` (the command and environment of a one-process run),
`prepare_multi_gpu_env` (torchrun's arguments set on the Namespace and the environment), `PrepareForLaunch` (a
function made ready to run as one of several forked processes), the SageMaker argument converter
`_convert_nargs_to_dict`, `env_var_path_add` and `_filter_args`.

The variables are Accelerate's (ACCELERATE_*, FSDP_*, OMP_NUM_THREADS, KMP_*), for code that builds Accelerate's
launch itself. `acc launch` hands its workers their plan in ACC_LAUNCH instead (`acc.assembly.handoff`).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import warnings
from ast import literal_eval
from typing import Any

from acc.contract.enums import DynamoBackend, PrecisionType

_VISIBLE = (("xpu", "ZE_AFFINITY_MASK"), ("mlu", "MLU_VISIBLE_DEVICES"), ("sdaa", "SDAA_VISIBLE_DEVICES"),
            ("musa", "MUSA_VISIBLE_DEVICES"), ("npu", "ASCEND_RT_VISIBLE_DEVICES"), ("hpu", "HABANA_VISIBLE_MODULES"),
            ("neuron", "NEURON_RT_VISIBLE_CORES"))


def _visible_devices_variable() -> str:
    """The variable that restricts this machine's accelerators (CUDA_VISIBLE_DEVICES unless another kind is
    present)."""
    import torch

    for name, variable in _VISIBLE:
        device = getattr(torch, name, None)
        if device is not None and getattr(device, "is_available", lambda: False)():
            return variable
    return "CUDA_VISIBLE_DEVICES"


def _precision_and_dynamo(args: argparse.Namespace, env: dict[str, str]) -> None:
    precision = str(args.mixed_precision or "no").lower()
    valid = [p.value for p in PrecisionType]
    if precision not in valid:
        raise ValueError(f"Unknown mixed_precision mode: {precision}. Choose between {valid}.")
    if precision == "fp8":
        raise RuntimeError("mixed_precision fp8 is not available in acc yet: use no, fp16 or bf16")
    env["ACCELERATE_MIXED_PRECISION"] = precision
    backend = str(args.dynamo_backend or "no").upper()
    backends = [b.value for b in DynamoBackend]
    if backend not in backends:
        raise ValueError(f"Unknown dynamo backend: {backend}. Choose between {backends}.")
    env["ACCELERATE_DYNAMO_BACKEND"] = backend
    env["ACCELERATE_DYNAMO_MODE"] = str(getattr(args, "dynamo_mode", "default"))
    for name in ("fullgraph", "dynamic", "regional_compilation"):
        env[f"ACCELERATE_DYNAMO_USE_{name.upper()}"] = str(getattr(args, f"dynamo_use_{name}", False))


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command (python SCRIPT ARGS, or -m MODULE, or the program itself with --no_python) and the environment
    Accelerate's simple launcher runs a one-process (or CPU) job with."""
    if args.no_python and args.module:
        raise ValueError("--module and --no_python cannot be used together: give one")
    if getattr(args, "mpirun_hostfile", None) is not None:
        raise ValueError(f"--mpirun_hostfile {args.mpirun_hostfile}: acc does not start workers with mpirun; run "
                         "`acc launch` on each machine with --num_machines, --machine_rank and --main_process_ip")
    cmd = [] if args.no_python else [sys.executable, *(["-m"] if args.module else [])]
    cmd += [args.training_script, *args.training_script_args]
    env = os.environ.copy()
    use_cpu = bool(args.cpu or getattr(args, "use_cpu", False))
    env["ACCELERATE_USE_CPU"] = str(use_cpu)
    if args.debug:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if args.gpu_ids not in ("all", None):
        env[_visible_devices_variable()] = args.gpu_ids
    processes, machines = getattr(args, "num_processes", None), args.num_machines
    if machines > 1 and (args.main_process_ip is None or args.main_process_port is None):
        raise ValueError("a run on several machines needs --main_process_ip and --main_process_port (where machine "
                         "0 listens)")
    if (processes is not None and processes > 1) or machines > 1:
        env["MASTER_ADDR"] = args.main_process_ip if args.main_process_ip is not None else "127.0.0.1"
        env["MASTER_PORT"] = str(args.main_process_port) if args.main_process_port is not None else "29500"
    if use_cpu:
        env["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        env["KMP_BLOCKTIME"] = "1"
    _precision_and_dynamo(args, env)
    env["OMP_NUM_THREADS"] = str(args.num_cpu_threads_per_process)
    if args.enable_cpu_affinity:
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    return cmd, env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", port)) == 0


_FSDP_VARIABLES = ("sharding_strategy", "reshard_after_forward", "offload_params", "min_num_params",
                   "auto_wrap_policy", "transformer_layer_cls_to_wrap", "backward_prefetch", "state_dict_type",
                   "forward_prefetch", "use_orig_params", "cpu_ram_efficient_loading", "sync_module_states",
                   "activation_checkpointing", "activation_checkpointing_offload", "ignored_modules")
_FSDP_NAME = {"transformer_layer_cls_to_wrap": "TRANSFORMER_CLS_TO_WRAP"}


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """torchrun's arguments for Accelerate's multi-GPU launcher, set on `args` (nproc_per_node, master_port or
    rdzv_endpoint, ...), and the workers' environment. --main_process_port 0 picks a free port."""
    if args.main_process_port == 0:
        args.main_process_port = _free_port()
    elif args.main_process_port is None:
        args.main_process_port = 29500
    processes, machines, port = args.num_processes, args.num_machines, args.main_process_port
    if machines > 1:
        args.nproc_per_node, args.nnodes, args.node_rank = str(processes // machines), str(machines), \
            int(args.machine_rank)
        if getattr(args, "same_network", False):
            args.master_addr, args.master_port = str(args.main_process_ip), str(port)
        else:
            args.rdzv_endpoint = f"{args.main_process_ip}:{port}"
    else:
        args.nproc_per_node = str(processes)
        args.master_port = str(port)
    if (machines <= 1 or int(args.machine_rank or 0) == 0) and _in_use(port):
        if machines > 1:
            raise ConnectionError(f"port {port} is in use on this machine: give another --main_process_port (or 0 "
                                  "for a free one, on one machine)")
        args.standalone = True
        warnings.warn(f"Port `{port}` is already in use: the run looks for a free port itself (standalone mode); "
                      "give --main_process_port PORT, or 0, to choose", stacklevel=2)
    if args.module and args.no_python:
        raise ValueError("--module and --no_python cannot be used together: give one")
    env = os.environ.copy()
    if args.debug:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    gpu_ids = getattr(args, "gpu_ids", "all")
    if gpu_ids not in ("all", None):
        env[_visible_devices_variable()] = gpu_ids
    _precision_and_dynamo(args, env)
    if args.use_fsdp:
        env["ACCELERATE_USE_FSDP"] = "true"
        env["FSDP_VERSION"] = str(getattr(args, "fsdp_version", None) or "1")
        for name in _FSDP_VARIABLES:
            value = getattr(args, f"fsdp_{name}", None)
            if value is not None:
                text = str(value).lower() if isinstance(value, bool) or name not in (
                    "sharding_strategy", "auto_wrap_policy", "transformer_layer_cls_to_wrap", "backward_prefetch",
                    "state_dict_type", "min_num_params", "ignored_modules") else str(value)
                env["FSDP_" + _FSDP_NAME.get(name, name.upper())] = text
    if getattr(args, "use_megatron_lm", False):
        raise ValueError("--use_megatron_lm: acc has no Megatron-LM backend; shard with --use_fsdp or --use_deepspeed")
    env["OMP_NUM_THREADS"] = str(args.num_cpu_threads_per_process)
    if args.enable_cpu_affinity:
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    return env


def _infer(text: str) -> Any:
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number // 1 == number else number


def _convert_nargs_to_dict(nargs: list[str]) -> dict[str, Any]:
    """A script's `--key value` arguments as a dict of typed values (int, float, bool or str), as SageMaker's
    hyperparameters. A flag without a value (argparse's store_true) is a ValueError: SageMaker passes values only."""
    parser = argparse.ArgumentParser()
    _, unknown = parser.parse_known_args(nargs)
    for index, argument in enumerate(unknown):
        if not argument.startswith("-"):
            continue
        if index + 1 >= len(unknown) or unknown[index + 1].startswith("-"):
            raise ValueError(f"{argument} has no value: SageMaker passes every script argument as `--key value`, so "
                             "store_true/store_false flags cannot be given; give the argument an explicit type "
                             "and value")
        parser.add_argument(argument, type=_infer)
    return {key: literal_eval(value) if value in ("True", "False") else value
            for key, value in vars(parser.parse_args(nargs)).items()}


def env_var_path_add(env_var_name: str, path_to_add: str) -> str:
    """The variable's ':'-separated paths with `path_to_add` appended (the variable itself is not changed)."""
    paths = [p for p in os.environ.get(env_var_name, "").split(":") if len(p) > 0]
    paths.append(str(path_to_add))
    return ":".join(paths)


def _filter_args(args: argparse.Namespace, parser: argparse.ArgumentParser,
                 default_args: list[str] | None = None) -> argparse.Namespace:
    """`args` restricted to the options `parser` knows (the others dropped), parsed over `default_args`."""
    new_args, _ = parser.parse_known_args(default_args or [])
    for key, value in vars(args).items():
        if key in vars(new_args):
            setattr(new_args, key, value)
    return new_args


class PrepareForLaunch:
    """`launcher` made ready to run as process `index` of a `torch.multiprocessing` start (Accelerate's): called
    with (index, *args), it sets LOCAL_RANK and RANK (NPROC processes per machine, machine NODE_RANK) for a
    multi-process `distributed_type`, or with `debug` joins a gloo group through ACCELERATE_DEBUG_RDV_FILE, marks
    the process FORK_LAUNCHED and calls `launcher(*args)`. Picklable when `launcher` is."""

    _MULTI = ("MULTI_GPU", "MULTI_MLU", "MULTI_MUSA", "MULTI_NPU", "MULTI_XPU", "MULTI_CPU", "MULTI_NEURON")

    def __init__(self, launcher: Any, distributed_type: Any = "NO", debug: bool = False) -> None:
        from acc.contract.enums import DistributedType

        self.launcher = launcher
        self.distributed_type = DistributedType(getattr(distributed_type, "value", distributed_type))
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> None:
        if self.debug:
            import torch.distributed as dist

            world_size = int(os.environ["WORLD_SIZE"])
            store = dist.FileStore(os.environ["ACCELERATE_DEBUG_RDV_FILE"], world_size)
            dist.init_process_group("gloo", rank=index, store=store, world_size=world_size)
        elif self.distributed_type.value in self._MULTI:
            os.environ["LOCAL_RANK"] = str(index)
            nproc, node_rank = int(os.environ.get("NPROC", 1)), int(os.environ.get("NODE_RANK", 0))
            os.environ["RANK"] = str(nproc * node_rank + index)
        os.environ["FORK_LAUNCHED"] = "1"
        self.launcher(*args)
