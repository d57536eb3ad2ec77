"""Launching a function, not a script: `acc.launch(fn)`, `notebook_launcher` and `debug_launcher`.

The engine is the one `acc launch` uses. Settings resolve with the same chain (arguments > ACC_* environment
variables > ./acc.toml or `config_file` > the user file > defaults, each value with its source), the chosen
backend plans the run (`acc_launch_plan`), and:

- `elastic` plans (ddp, fsdp, deepspeed) run `fn(*args)` in workers forked from this process by torch's elastic
  agent, through the function entrypoint `acc launch` forks scripts with. A function defined in a notebook cell,
  in `__main__` or as a closure is never pickled. Its return values come back through the agent.
- `process` plans (the cpu backend: one process) run `fn(*args)` here, as `acc launch` runs a script in its own
  process.

What `acc launch` guarantees holds here too: a failing rank is reported (first failure, its own traceback), here as
a `WorkerFailedError` raised in the caller; an interrupt (Ctrl-C, a notebook's interrupt button) or SIGTERM stops
every worker before it reaches the caller as it would have without acc (KeyboardInterrupt); the caller's
environment, signal handlers and logging are as they were after every launch, so the next launch works. Torch-free
to import; torch is imported when a launch runs.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from typing import Any, Callable, Mapping

from acc.contract.launch_plan import Target
from acc.errors import AccError, ConfigError, LaunchError, did_you_mean

__all__ = ["WorkerFailedError", "debug_launcher", "launch", "notebook_launcher"]

_ONE_AT_A_TIME = threading.Lock()  # a launch swaps this process's environment and signal handlers


class WorkerFailedError(AccError, RuntimeError):
    """A launched function failed on a worker. The message is the report `acc launch` prints (the first failing
    rank, its own traceback, the tail of its output, every other rank that failed).

    Attributes: `rank` and `local_rank` of the first failure, `exitcode` (negative: killed by that signal),
    `error` (its exception's last line, e.g. "ValueError: boom"; "" when it died without one), `traceback` (the
    worker's own traceback text; "" when it died without one), `report` (the whole report) and `failures` (rank ->
    exit code, every rank that failed).
    """

    exit_code = 1

    def __init__(self, report: str, rank: int, local_rank: int, exitcode: int, error: str = "", traceback: str = "",
                 failures: Mapping[int, int] | None = None):
        super().__init__(report)
        self.report, self.rank, self.local_rank, self.exitcode = report, rank, local_rank, exitcode
        self.error, self.traceback = error, traceback
        self.failures = dict(failures or {rank: exitcode})


class LaunchDescription(str):
    """What `dry_run=True` returns: the plan and every setting with its source (the text `acc launch --dry-run`
    prints). A str that shows as text in a notebook."""

    def __repr__(self) -> str:
        return str(self)


class _FunctionTarget(Target):
    """The target of a function launch, as the dry run and the run manifest show it."""

    def __str__(self) -> str:
        return self.program

    def command(self) -> str:
        return f"function {self.program}(*args), forked from this process"


def launch(fn: Callable[..., Any], *args: Any, backend: str | None = None, nproc: int | None = None,
           return_all: bool = False, config_file: str | None = None, dry_run: bool = False, **settings: Any) -> Any:
    """Run `fn(*args)` on every process of a launch and return the main process's return value.

    `backend`, `nproc` and every keyword in `settings` are the launch settings `acc launch` takes, by their
    setting names (`mixed_precision="bf16"`, `max_restarts=1`, `semantics="acc"`, a backend's own such as
    `fsdp_strategy=...`; `acc launch --backend NAME --help` lists them). They resolve as for `acc launch`: these
    arguments > ACC_* environment variables > ./acc.toml (or `config_file`, acc's TOML or an Accelerate YAML) > the
    user file > defaults, and without a backend detection picks one (`nproc=2` on a CPU machine: ddp). The sources
    show with `dry_run=True`, which starts nothing and returns the plan and every setting with its source (the
    text of `acc launch --dry-run`), in the run manifest, and in the workers (`accelerator.settings.source(name)`).

    The backend decides how the processes start: ddp, fsdp and deepspeed fork workers from this process through
    torch's elastic agent (the function is not pickled: it may be defined in a notebook cell, in `__main__`, or be
    a closure); the cpu backend runs `fn` here, once. Workers forked after CUDA was initialised in this process
    cannot use it, so that is refused, saying what initialised it. `start_method="spawn"` and `max_restarts` start
    fresh interpreters instead, which import `fn` by name (it must be defined in a module) and unpickle `args`.

    Returns the main process's (rank 0's) return value, or with `return_all=True` a list of every rank's, by rank
    (on a multi-machine run, this machine's ranks). Return values travel through a pipe: they must be picklable;
    tensors come back on the CPU. Keyword arguments of `fn` itself: pass `functools.partial(fn, ...)`.

    Raises `WorkerFailedError` (the first failing rank, its traceback) when a worker fails; KeyboardInterrupt after
    an interrupt stopped every worker; ConfigError / ValidationError / LaunchError before anything starts.
    """
    given = {name: (value, f"argument acc.launch({name}=...)") for name, value in settings.items()}
    for name, value in (("backend", backend), ("nproc", nproc)):
        if value is not None:
            given[name] = (value, f"argument acc.launch({name}=...)")
    return _launch(fn, args, given, {}, config_file=config_file, return_all=return_all, dry_run=dry_run,
                   caller="acc.launch")


def notebook_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int | None = None,
                      mixed_precision: str = "no", use_port: str = "29500", master_addr: str = "127.0.0.1",
                      node_rank: int = 0, num_nodes: int = 1, rdzv_backend: str = "static", rdzv_endpoint: str = "",
                      rdzv_conf: dict | None = None, rdzv_id: str = "none", max_restarts: int = 0,
                      monitor_interval: float = 0.1, log_line_prefix_template: str | None = None) -> Any:
    """Hugging Face Accelerate's `notebook_launcher`: run `function(*args)` on `num_processes` processes per
    machine (`num_nodes` machines, this one being `node_rank`), from a notebook or any Python program.

    The arguments mean what they mean in Accelerate 1.15: `mixed_precision` ("no", "fp16", "bf16"); `master_addr` and
    `use_port` (or `rdzv_endpoint`, "host:port") where the machines meet; `rdzv_backend`, `rdzv_conf` (extra
    rendezvous configuration for torch's elastic agent), `rdzv_id` (the run id), `max_restarts`, `monitor_interval`
    and `log_line_prefix_template` as torch's elastic agent takes them. A function defined in the notebook runs in
    workers forked from the kernel, so nothing may have initialised CUDA in the kernel before (refused, saying what
    did); create the Accelerator inside `function`.

    acc's additions: an argument left at Accelerate's default is not passed, so ACC_* variables and acc.toml apply
    (`num_processes=None` takes the process count from there, or one process per GPU); on one machine a free port
    is picked unless `use_port`/`rdzv_endpoint` name one (Accelerate's fixed 29500 collides when two notebooks
    launch); with `num_nodes > 1`, `master_addr:use_port` and the static rendezvous are Accelerate's defaults there
    (under ACC_* variables and acc.toml). The backend is the configured one (acc.toml / ACC_BACKEND: `fsdp` runs
    fsdp), else detection's (ddp for several processes). One process runs `function` in this process, as
    Accelerate does. Returns the main process's return value (Accelerate returns None); a worker's failure raises
    `WorkerFailedError` with its traceback.
    """
    caller = "notebook_launcher"

    def label(parameter: str) -> str:
        return f"argument notebook_launcher({parameter}=...)"

    given: dict[str, tuple[Any, str]] = {}
    defaults: dict[str, tuple[Any, str]] = {}
    if num_processes is not None:
        given["nproc"] = (num_processes, label("num_processes"))
    if str(mixed_precision).lower() != "no":
        given["mixed_precision"] = (str(mixed_precision).lower(), label("mixed_precision"))
    if node_rank != 0:
        given["machine_rank"] = (node_rank, label("node_rank"))
    if num_nodes != 1:
        given["num_machines"] = (num_nodes, label("num_nodes"))
    if rdzv_endpoint:
        host, _, port = str(rdzv_endpoint).rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"{caller}(rdzv_endpoint={rdzv_endpoint!r}): expected HOST:PORT")
        given["main_process_ip"] = (host, label("rdzv_endpoint"))
        given["main_process_port"] = (int(port), label("rdzv_endpoint"))
    else:
        if master_addr != "127.0.0.1":
            given["main_process_ip"] = (master_addr, label("master_addr"))
        if str(use_port) != "29500":
            given["main_process_port"] = (_port(use_port, caller), label("use_port"))
    if num_nodes != 1:  # machines must meet somewhere known: Accelerate's defaults, under env and acc.toml
        defaults["main_process_ip"] = (master_addr, "default of notebook_launcher(master_addr=...) for num_nodes > 1")
        defaults["main_process_port"] = (_port(use_port, caller),
                                         "default of notebook_launcher(use_port=...) for num_nodes > 1")
    if rdzv_backend != "static":
        given["rdzv_backend"] = (rdzv_backend, label("rdzv_backend"))
    elif num_nodes != 1:
        defaults["rdzv_backend"] = ("static", "default of notebook_launcher(rdzv_backend=...) for num_nodes > 1")
    if max_restarts != 0:
        given["max_restarts"] = (max_restarts, label("max_restarts"))
    if monitor_interval != 0.1:
        given["monitor_interval"] = (monitor_interval, label("monitor_interval"))
    agent = {"rdzv_configs": dict(rdzv_conf or {}), "run_id": None if rdzv_id == "none" else str(rdzv_id),
             "log_line_prefix_template": log_line_prefix_template}
    return _launch(function, tuple(args), given, defaults, agent=agent, caller=caller)


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> Any:
    """Hugging Face Accelerate's `debug_launcher`: run `function(*args)` on `num_processes` CPU processes (ddp over
    gloo, no mixed precision), for tests and debugging. Other settings (acc.toml, ACC_* variables) apply. Returns
    the main process's return value (Accelerate returns None); a worker's failure raises `WorkerFailedError`."""
    given = {name: (value, f"argument debug_launcher (CPU debugging: {name}={value!r})") for name, value in
             (("backend", "ddp"), ("nproc", num_processes), ("cpu", True), ("mixed_precision", "no"))}
    return _launch(function, tuple(args), given, {}, caller="debug_launcher")


def _port(value: Any, caller: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{caller}(use_port={value!r}): expected a port number") from None


# -- the launch


def _launch(fn: Callable[..., Any], args: tuple, given: Mapping[str, tuple[Any, str]],
            defaults: Mapping[str, tuple[Any, str]], *, config_file: str | None = None, return_all: bool = False,
            dry_run: bool = False, agent: Mapping[str, Any] | None = None, caller: str) -> Any:
    from acc.launcher import orchestrate

    if not callable(fn):
        raise TypeError(f"{caller}: expected a function to run, got {type(fn).__name__}")
    assembly = _resolve(given, defaults, config_file, caller)
    plan = orchestrate.make_plan(assembly)
    agent = dict(agent or {})
    if agent.get("run_id") and plan.rendezvous is not None:
        import dataclasses

        plan.rendezvous = dataclasses.replace(plan.rendezvous, run_id=agent["run_id"])
    target = _FunctionTarget(_qualified_name(fn))
    if dry_run:
        from acc.launcher.describe import describe

        text = describe(assembly, plan, target)
        if plan.engine == "elastic":
            text += ("\nnote: the function runs in workers forked from this process (it is not pickled); refused if "
                     "CUDA was initialised here; start_method='spawn' and max_restarts start fresh interpreters, which "
                     "import it by name")
        return LaunchDescription(text)
    if plan.engine not in ("elastic", "process"):
        backend = assembly.settings["backend"]
        raise LaunchError(f"{caller}: the {backend} backend starts its processes with the '{plan.engine}' engine, "
                          "which runs scripts, not functions: put the function in a script and run "
                          f"`acc launch --backend {backend} script.py`")
    if assembly.detection_line:
        print(f"acc: {assembly.detection_line}", file=sys.stderr)
    if not _ONE_AT_A_TIME.acquire(blocking=False):
        raise LaunchError(f"{caller}: another launch is running in this process; launches from one process run one "
                          "at a time")
    try:
        env = orchestrate.worker_environment(assembly, plan)
        run_dir = orchestrate.record_run(assembly, plan, target)
        if run_dir is not None:
            env["ACC_RUN_DIR"] = str(run_dir.resolve())
        env.update(orchestrate.logging_environment(assembly, run_dir))
        if plan.engine == "process":
            values = _run_here(fn, args, env, caller)
        else:
            values = _run_forked(plan, fn, args, env, agent, caller)
    finally:
        _ONE_AT_A_TIME.release()
    ranks = sorted(values)
    return [values[r] for r in ranks] if return_all else values[ranks[0]]


def _resolve(given: Mapping[str, tuple[Any, str]], defaults: Mapping[str, tuple[Any, str]],
             config_file: str | None, caller: str) -> Any:
    """The assembly for these arguments: kernel settings first (they choose the backend and the plugins), then the
    chosen plugins' own; each argument's source names the argument."""
    from acc.assembly.choose import _core_registry, assemble

    core = _core_registry()
    for name, (value, label) in given.items():
        if name in core:
            _check_value(core[name], value, label, caller)
    kernel = {name: value for name, (value, _) in given.items() if name in core}
    assembly = assemble(flags=kernel, config_file=config_file, detect=True)
    registry = assembly.registry
    for name, (value, label) in given.items():
        if name not in registry:
            raise ConfigError(f"{caller}({name}=...): no launch setting is named {name!r}"
                              f"{did_you_mean(name, registry.names())} (backend {assembly.settings['backend']}); "
                              f"known: {', '.join(registry.names())}")
        _check_value(registry[name], value, label, caller)
    flags = {name: value for name, (value, _) in given.items()}
    filled = {name: pair for name, pair in defaults.items() if name not in flags and assembly.settings.is_default(name)}
    flags.update({name: value for name, (value, _) in filled.items()})
    if flags != kernel:
        assembly = assembly.with_flags(flags)
    sources = assembly.settings.sources
    for name, (_, label) in {**given, **filled}.items():
        sources[name] = label
    return assembly


def _check_value(setting: Any, value: Any, label: str, caller: str) -> None:
    try:
        setting.convert(value)
    except ValueError as exc:
        raise ConfigError(f"{label.replace('argument ', '', 1)}: {exc} ({setting.name}: {setting.help})") from None


def _qualified_name(fn: Any) -> str:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    module = getattr(inner, "__module__", None) or "?"
    return f"{module}.{getattr(inner, '__qualname__', type(inner).__name__)}"


def _run_here(fn: Callable[..., Any], args: tuple, env: Mapping[str, str], caller: str) -> dict[int, Any]:
    """The `process` engine for a function: `fn(*args)` in this process, with the launch's environment (as a
    script run by `acc launch` on the cpu backend gets it); a runtime it set up is ended afterwards."""
    import traceback

    runtime_module = sys.modules.get("acc.runtime.worker")
    before = runtime_module.current() if runtime_module is not None else None
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        value = fn(*args)
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        if exc.code in (0, None):
            value = None
        else:
            code = exc.code if isinstance(exc.code, int) else 1
            report = f"{caller}: the run failed\n  rank 0 (local rank 0), first failure: exit code {code}"
            raise WorkerFailedError(report, 0, 0, code) from exc
    except BaseException as exc:  # noqa: BLE001 - reported as a worker's failure, the original chained
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        error = traceback.format_exception_only(type(exc), exc)[-1].strip()
        report = "\n".join([f"{caller}: the run failed", "  rank 0 (local rank 0), first failure: exit code 1",
                            *("    " + line for line in text.rstrip().splitlines())])
        raise WorkerFailedError(report, 0, 0, 1, error, text) from exc
    finally:
        runtime_module = sys.modules.get("acc.runtime.worker")
        started = runtime_module.current() if runtime_module is not None else None
        if started is not None and started is not before:
            started.teardown()
        os.environ.clear()
        os.environ.update(saved)
    return {0: value}


# -- forked workers through torch's elastic agent

_CAUGHT = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGCHLD")  # the agent's, acc's stack and exit watchers


def _run_forked(plan: Any, fn: Callable[..., Any], args: tuple, env: Mapping[str, str], agent: Mapping[str, Any],
                caller: str) -> dict[int, Any]:
    """The `elastic` engine for a function, with the launcher of `acc launch` (`acc.launcher.elastic`): the same
    launch configuration, logs, exit watcher and failure report; this process's state is restored afterwards."""
    import logging
    import tempfile

    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from acc.launcher import elastic, fork

    method, why = _start_method(env.get(elastic.START_METHOD_ENV, "auto"), plan.max_restarts, fn, args, caller)
    from acc.launcher import worker_memory

    if method == "fork" and worker_memory.forked_without_huge_pages(env):
        print(f"{caller}: note: worker_memory='release': workers forked from this interpreter return freed tensors "
              "at once but get no 2 MiB pages (glibc reads that setting when a process starts); start Python with "
              "GLIBC_TUNABLES=glibc.malloc.hugetlb=1, or use start_method='spawn'", file=sys.stderr)
    if env.get("ACC_DEBUG"):
        print(f"{caller}: start method {method} ({why})", file=sys.stderr)
    log_dir = env.get(elastic.LOG_DIR_ENV) or tempfile.mkdtemp(prefix="acc-logs-")
    store = None
    if plan.num_machines == 1:  # the store on loopback (or listen_address), as acc launch: held until the end
        from acc.launcher import listen

        plan, store = listen.serve_one_machine(plan)
    config = elastic.launch_config(plan, log_dir, env.get(elastic.TEE_ENV, "") == "1", method,
                                   elastic._monitor_interval(env))
    config.rdzv_configs.update(agent.get("rdzv_configs") or {})
    if agent.get("log_line_prefix_template") is not None:
        config.log_line_prefix_template = agent["log_line_prefix_template"]
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {getattr(signal, n): signal.getsignal(getattr(signal, n)) for n in _CAUGHT if hasattr(signal, n)} \
        if main_thread else {}
    logger = logging.getLogger("torch.distributed.elastic")
    level = logger.level
    saved_env = dict(os.environ)
    watcher = machines = None
    stopped_by = None
    streams: dict[str, Any] = {}
    tracker_before = _resource_tracker_pid()
    try:
        if not env.get("ACC_DEBUG"):
            logger.setLevel(logging.CRITICAL)
        os.environ.clear()  # workers inherit this process's environment: make it theirs for the launch
        os.environ.update(env)
        streams = _streams_with_descriptors()
        if main_thread:
            elastic._forward_sigusr1()
        machines = _roll_call(plan, caller)  # several machines: all present, then heartbeats (as acc launch)
        if main_thread and method == "fork":
            watcher = fork.ExitWatcher()
            watcher.install()
        values = elastic.run_agent(elastic_launch(config, fork.run_function), fn, tuple(args))
        if machines is not None:
            machines.done(0)
    except ChildFailedError as exc:
        lost = machines.verdict() if machines is not None else None
        failure = _failure(exc, elastic.rank_log_dirs(log_dir, config.run_id), watcher.codes if watcher else {},
                           caller, lost)
        if machines is not None:
            machines.done(failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode)
        raise failure from None
    except SignalException as exc:  # the agent stopped every worker; the signal now goes where it would have
        if machines is not None and machines.lost:
            machines.done(1)
            raise LaunchError(f"{caller}: {machines.lost}; the workers on this machine were stopped") from None
        if machines is not None:
            machines.done(128 + int(exc.sigval))
        stopped_by = int(exc.sigval)
    finally:
        if machines is not None:
            machines.close()
        store = None  # the one-machine store ends with the launch  # noqa: F841
        for name, stream in streams.items():
            setattr(sys, name, stream)
        os.environ.clear()
        os.environ.update(saved_env)
        logger.setLevel(level)
        for sig, handler in handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if method == "spawn":
            _stop_resource_tracker(tracker_before)
    if stopped_by is not None:
        _deliver(stopped_by, handlers.get(stopped_by))
        raise LaunchError(f"{caller}: stopped by {signal.Signals(stopped_by).name}; every worker was stopped too")
    return values


def _roll_call(plan: Any, caller: str) -> Any:
    """Across machines, what acc launch does before the agent starts: wait (rdzv_timeout) for every machine, say
    which one holds the main process, then exchange heartbeats (a lost machine stops this one's workers)."""
    if plan.num_machines == 1:
        return None
    from acc.launcher.machines import Machines, RendezvousTimeout

    machines = Machines(plan)
    try:
        machines.join()
    except RendezvousTimeout as exc:
        raise LaunchError(f"{caller}: {exc}") from None
    print(f"{caller}: {machines.describe()}", file=sys.stderr)
    machines.watch()
    return machines


class _WithDescriptor:
    """`sys.stdout`/`sys.stderr` of a notebook kernel (or a test runner) that has no file descriptor, given the
    process's own (1, 2) for the launch: the agent redirects a worker's output by the descriptor behind
    `sys.stdout`, and fails without one. Writes still go to the wrapped stream (the notebook)."""

    def __init__(self, stream: Any, fd: int):
        self._stream, self._fd = stream, fd

    def fileno(self) -> int:
        return self._fd

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _streams_with_descriptors() -> dict[str, Any]:
    """Wrap the standard streams that have no file descriptor; returns the originals to put back."""
    replaced = {}
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            replaced[name] = stream
            setattr(sys, name, _WithDescriptor(stream, fd))
    return replaced


def _resource_tracker_pid() -> int | None:
    from multiprocessing import resource_tracker

    return getattr(resource_tracker._resource_tracker, "_pid", None)


def _stop_resource_tracker(before: int | None) -> None:
    """Spawned workers make multiprocessing start its resource tracker, a helper process that would live as long
    as this one: stop it when this launch started it, so no process of the launch is left."""
    import gc
    from multiprocessing import resource_tracker

    if before is not None or _resource_tracker_pid() is None:
        return
    gc.collect()  # the agent's semaphores are unregistered as they are collected
    try:
        resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a helper that cannot be stopped ends with this process
        pass


def _deliver(signum: int, handler: Any) -> None:
    """Hand a signal the agent caught to the handler this process had before the launch (KeyboardInterrupt for
    SIGINT, as a notebook's interrupt button expects), or to the default action."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL or (handler is None and signum != signal.SIGINT):
        os.kill(os.getpid(), signum)
    elif signum == signal.SIGINT and handler is None:
        raise KeyboardInterrupt


def _failure(exc: Any, log_dirs: Mapping[int, Any], exits: Mapping[int, int], caller: str,
             lost: str | None = None) -> WorkerFailedError:
    """The report `acc launch` prints, as an exception with the first failure's rank and traceback (`lost`: the
    machine whose loss made the workers here fail)."""
    from acc.launcher import elastic

    failures = elastic._with_recorded(exc.failures, dict(log_dirs), dict(exits))
    root = elastic._root_rank(failures)
    first = failures[root]
    message, callstack = elastic._message(first)
    report = elastic.failure_report(exc, dict(log_dirs), dict(exits))
    report = report.replace("acc launch: the run failed", f"{caller}: the run failed", 1)
    if lost:
        report = f"{caller}: {lost}; the workers here failed because of it:\n{report}"
    error = message.strip().splitlines()[-1] if message.strip() else ""
    return WorkerFailedError(report, root, first.local_rank, first.exitcode, error, callstack,
                             {rank: f.exitcode for rank, f in failures.items()})


def _start_method(asked: str, max_restarts: int, fn: Any, args: tuple, caller: str) -> tuple[str, str]:
    """("fork" | "spawn", why) for a function. Forked unless asked otherwise (the function need not be importable);
    threads in this process (a notebook kernel has several) do not prevent it, initialised CUDA refuses it."""
    if asked == "spawn" or max_restarts or os.name != "posix":
        why = ("start_method='spawn' was asked for" if asked == "spawn" else
               f"max_restarts={max_restarts}: restarted rounds start fresh interpreters (forking again after the "
               "agent's rendezvous hangs on torch 2.13)" if max_restarts else "fork needs a POSIX system")
        problem = _not_importable(fn, args)
        if problem:
            raise LaunchError(f"{caller}: {why}, which import the function by name and unpickle its arguments, but "
                              f"{problem}. Define it in a module (a .py file beside the notebook) and import it from "
                              "there" + (", or launch without max_restarts" if max_restarts else
                                         ", or leave start_method at auto (fork)"))
        return "spawn", why
    from acc.launcher.fork import preload

    preload()
    from acc.launcher.notebook import cuda_initialised

    reason = cuda_initialised(caller)
    if reason:
        raise LaunchError(reason)
    others = threading.active_count() - 1
    return "fork", "workers forked from this process, which imported torch once" + (
        f" ({others} other thread(s) run here: only the calling one is copied into the workers)" if others else "")


def _not_importable(fn: Any, args: tuple) -> str:
    """Why a fresh interpreter could not get `fn(*args)` by pickling ('' when it can)."""
    import pickle

    inner = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(inner, "__qualname__", repr(inner))
    main = sys.modules.get("__main__")
    if "<lambda>" in name or "<locals>" in name:
        return f"`{name}` is a lambda or is defined inside another function"
    if getattr(inner, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        return f"`{name}` is defined in a notebook or an interactive session"
    for what, obj in (("the function", fn), ("its arguments", args)):
        try:
            pickle.dumps(obj)
        except Exception as exc:  # noqa: BLE001 - any pickling failure
            return f"{what} cannot be pickled ({type(exc).__name__}: {exc})"
    return ""




