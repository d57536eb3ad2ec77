"""From an assembly to running processes: validate, ask the backend for its plan, execute it. Torch-free
until an executor that needs torch runs."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from acc.assembly import clusters as cluster
from acc.assembly import handoff
from acc.assembly.choose import Assembly
from acc.assembly.plugins import declared_capabilities, module_available, plugin_requires
from acc.contract.capabilities import Capabilities
from acc.contract.launch_plan import ENGINES, LaunchPlan, Target
from acc.errors import LaunchError, ValidationError
from acc.launcher.plans import task_plan

# engine -> module whose `execute(plan, target, env) -> int` runs it
EXECUTORS = {
    "process": "acc.launcher.process",
    "elastic": "acc.launcher.elastic",
    "pjrt": "acc.launcher.pjrt",
    "task": "acc.launcher.process",  # one process the scheduler started: it becomes the worker (exec), as `process`
}


def validate(assembly: Assembly) -> None:
    """Every plugin may object; all problems are reported together (ValidationError)."""
    problems: list[str] = []
    for name, info in assembly.infos.items():
        plugin = assembly.pm.get_plugin(name)
        for module in plugin_requires(plugin):
            if not module_available(module):
                problems.append(
                    f"plugin '{name}' ({info.distribution} {info.version}) needs the module '{module}', which "
                    f"is not installed; install it with: pip install {info.distribution}  (it depends on it)"
                )
    problems.extend(_kernel_problems(assembly.settings))
    problems.extend(cluster.kernel_problems(assembly.settings, assembly.cluster))
    problems.extend(_capability_problems(assembly))
    for answer in assembly.pm.hook.acc_validate(settings=assembly.settings):
        problems.extend(answer or [])
    if problems:
        raise ValidationError(problems)


def capabilities(assembly: Assembly) -> Capabilities:
    """The chosen backend's promises (`acc_capabilities`)."""
    return declared_capabilities(assembly.pm, assembly.settings)


def _capability_problems(assembly: Assembly) -> list[str]:
    """Settings the backend's promises rule out (one place for every backend)."""
    from acc.runtime.parallelism import DIMS, setting_name, size_problems, sizes_from_settings

    s, caps = assembly.settings, capabilities(assembly)
    problems = []
    sizes = sizes_from_settings(s)
    if sizes is not None:  # before any process starts: the product against the world, the dims against the backend
        given = ", ".join(f"{setting_name(d)} {s[setting_name(d)]} (from {s.source(setting_name(d))})" for d in DIMS
                          if s[setting_name(d)] is not None)
        problems += [f"{given}: {problem}" for problem in
                     size_problems(sizes, s["nproc"] * s["num_machines"], s["backend"], tuple(caps.mesh_dims), s)]
    mode = s["mixed_precision"]
    if mode in caps.mixed_precision:
        return problems
    note = "; ".join(caps.notes)
    return problems + [f"mixed_precision '{mode}' is not supported by the {s['backend']} backend (it runs "
                       f"{', '.join(caps.mixed_precision)}; {mode} came from {s.source('mixed_precision')})"
                       + (f": {note}" if note else "")]


MAX_NPROC_FLOOR = 256  # processes per machine that are never refused
MAX_MACHINES = 65536
MAX_SECONDS = 10**7


def _kernel_problems(settings: Mapping) -> list[str]:
    """Checks of the kernel's own multi-machine settings (every multi-process backend relies on them)."""
    problems = []
    machines, rank = settings["num_machines"], settings["machine_rank"]
    most = max(MAX_NPROC_FLOOR, 8 * (os.cpu_count() or 1))
    if settings["nproc"] > most:
        problems.append(f"nproc {settings['nproc']} (from {settings.source('nproc')}) is more processes than one "
                        f"machine runs: at most {most} here (8 per CPU core, or {MAX_NPROC_FLOOR})")
    for name in ("timeout", "monitor_interval"):
        if settings[name] > MAX_SECONDS:
            problems.append(f"{name} {settings[name]:g} (from {settings.source(name)}) is above {MAX_SECONDS} s "
                            f"(115 days), more than a timer can hold; choose a number of seconds up to {MAX_SECONDS}")
    if machines > MAX_MACHINES:
        problems.append(f"num_machines {machines} (from {settings.source('num_machines')}) is above {MAX_MACHINES}")
    if rank >= machines:
        problems.append(f"machine_rank {rank} (from {settings.source('machine_rank')}) must be below "
                        f"num_machines {machines}: machines are numbered 0..{machines - 1}")
    if settings["rdzv_backend"] == "static" and settings["main_process_port"] is None:
        problems.append(f"rdzv_backend 'static' (from {settings.source('rdzv_backend')}) needs a known port on "
                        "machine 0: add --main-process-port PORT (the default c10d rendezvous picks a free port by "
                        "itself)")
    if machines > 1 and not settings["main_process_ip"]:
        problems.append(f"num_machines = {machines} (from {settings.source('num_machines')}) needs the address of "
                        "machine 0: add --main-process-ip ADDRESS (and the same --main-process-port on every machine)")
    return problems


def make_plan(assembly: Assembly) -> LaunchPlan:
    """Validate the settings and return the chosen backend's launch plan (checked to be well formed)."""
    validate(assembly)
    backend = assembly.settings["backend"]
    plan = assembly.pm.hook.acc_launch_plan(settings=assembly.settings)
    if plan is None:
        raise LaunchError(f"backend '{backend}' did not answer acc_launch_plan")
    if not isinstance(plan, LaunchPlan):
        raise LaunchError(f"backend '{backend}' answered acc_launch_plan with {type(plan).__name__}, not a LaunchPlan")
    problems = plan.problems()
    if problems:
        raise LaunchError(f"backend '{backend}' returned a malformed launch plan: " + "; ".join(problems))
    if assembly.cluster is not None and assembly.cluster.per_process:
        plan = task_plan(plan, assembly.cluster, assembly.settings)
    if not (assembly.cluster is not None and assembly.cluster.store_ready):
        check_port(plan, assembly.settings)
    return plan


def check_port(plan: LaunchPlan, settings: Mapping) -> None:
    """On the main machine, a port the user chose must be free (the agent would fail obscurely)."""
    import socket

    port = settings["main_process_port"]
    if plan.rendezvous is None or port is None or plan.machine_rank != 0:
        return
    if plan.engine == "task" and plan.env.get("RANK") != "0":
        return  # one task per process: only rank 0 hosts the store (its neighbours must not probe the port)
    host = (plan.rendezvous.endpoint or "").rsplit(":", 1)[0] or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as the store binds: a port whose last connections still linger (TIME_WAIT) is free, one listened on is not
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("" if host not in ("127.0.0.1", "localhost") else host, port))
        except OSError as exc:
            raise LaunchError(
                f"port {port} (from {settings.source('main_process_port')}) is already in use on this machine "
                f"({exc.strerror}); choose a free --main-process-port, or on one machine leave it out and a free "
                "port is picked"
            ) from None


def check_target(target: Target, cwd: Path | None = None) -> None:
    """The script must exist (or the module be importable, or the --no-python program be found) before any
    process starts."""
    if target.no_python:
        import shutil

        where = cwd or Path.cwd()
        path = Path(target.program)
        found = (path if path.is_absolute() else where / path).is_file() if "/" in target.program else \
            shutil.which(target.program) is not None
        if not found:
            raise LaunchError(f"program '{target.program}' (--no-python) is neither a file nor a command on PATH "
                              f"(cwd: {where})")
        return
    if target.is_module:
        # `python -m` looks in the current directory first; look there too, without importing anything
        top = target.program.split(".")[0]
        found = importlib.machinery.PathFinder.find_spec(top, [str(cwd or Path.cwd()), *sys.path]) is not None
        if not found and not module_available(top):
            raise LaunchError(
                f"module '{target.program}' cannot be found (cwd: {cwd or Path.cwd()}); check the name and "
                "that its package is installed or in the current directory"
            )
        return
    path = Path(target.program)
    if not (path if path.is_absolute() else (cwd or Path.cwd()) / path).exists():
        hint = " (to run a module, use -m)" if "." in target.program and "/" not in target.program and not target.program.endswith(".py") else ""
        raise LaunchError(
            f"script '{target.program}' does not exist (cwd: {cwd or Path.cwd()}); give the path to a Python "
            f"file{hint}"
        )


def environment_additions(plan: LaunchPlan, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the launch adds to the workers' environment (besides ACC_LAUNCH): the plan's variables, and
    OMP_NUM_THREADS = cores / local processes when several processes share a machine and it is unset
    (torchrun sets 1; an even share is faster for CPU training and avoids oversubscription)."""
    base = os.environ if base is None else base
    extra = dict(plan.env)
    if plan.nproc_per_machine > 1 and "OMP_NUM_THREADS" not in base and "OMP_NUM_THREADS" not in extra:
        extra["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // plan.nproc_per_machine))
    return extra


def worker_environment(assembly: Assembly, plan: LaunchPlan, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every worker starts with: ours, the launch's additions, the resolved settings."""
    from acc.launcher import worker_memory

    env = dict(os.environ if base is None else base)
    env.update(environment_additions(plan, base))
    env.update(worker_memory.environment(assembly.settings["worker_memory"], env, assembly.settings["huge_pages"]))
    env.update(parallelism_environment(assembly.settings))
    handoff.write(env, assembly.settings)
    return env


def parallelism_environment(settings: Mapping[str, Any]) -> dict[str, str]:
    """The mesh sizes the launch gives, as Accelerate's launcher hands them to its workers
    (PARALLELISM_CONFIG_<DIM>_SIZE): a script's `ParallelismConfig()` without arguments reads them."""
    from acc.runtime.parallelism import sizes_from_settings

    sizes = sizes_from_settings(settings)
    return {} if sizes is None else {f"PARALLELISM_CONFIG_{dim.upper()}_SIZE": str(size) for dim, size in sizes.items()}


def record_run(assembly: Assembly, plan: LaunchPlan, target: Target) -> Path | None:
    """Write the run manifest into a new directory under `output_dir` (none when output_dir is '')."""
    from acc.assembly import manifest
    from acc.assembly.redact import redact_shell

    s = assembly.settings
    if not s["output_dir"]:
        return None
    directory = manifest.run_directory(s["output_dir"], s["backend"], plan.machine_rank)
    world = {"num_machines": plan.num_machines, "nproc_per_machine": plan.nproc_per_machine,
             "world_size": plan.world_size, "engine": plan.engine}
    data = manifest.build(s, s.sources, assembly.plugin_versions(), manifest.launcher_command(), world)
    data["target"] = redact_shell(str(target))  # no --hf_token hf_... script argument is recorded
    data["device"] = plan.device
    manifest.write_json(directory / "manifest.json", data)
    return directory


def logging_environment(assembly: Assembly, run_dir: Path | None) -> dict[str, str]:
    """Where the executor keeps per-process logs, and whether it tees them (ACC_LOG_DIR, ACC_TEE)."""
    s = assembly.settings
    log_dir = s["log_dir"] or (str((run_dir / "logs").resolve()) if run_dir is not None else "")
    env = {"ACC_TEE": "1" if s["tee"] else "0", "ACC_START_METHOD": s["start_method"]}
    if log_dir:
        env["ACC_LOG_DIR"] = log_dir
    return env


def execute(plan: LaunchPlan, target: Target, env: Mapping[str, str], replace: bool = True) -> int:
    """Run the plan with the kernel's executor for its engine; returns the exit code.

    With `replace` (acc launch), an executor may turn this process into the worker; without it, the
    caller gets control back to report on the run (acc check)."""
    if plan.engine not in EXECUTORS:
        raise LaunchError(f"no executor for engine '{plan.engine}'; known engines: {', '.join(ENGINES)}")
    module = importlib.import_module(EXECUTORS[plan.engine])
    return module.execute(plan, target, env, replace=replace)
