"""Asking the cluster-environment plugins (entry-point group `acc.clusters`) what a scheduler knows about a launch.

`detect` (which environment is active), `setting_values` (its values as a source of the settings chain: flag >
env > cluster > file > default), `contradictions` and `check` (a flag or variable that disagrees with the
scheduler), `kernel_problems` (what one process per task cannot run), `task_plan` (one task per process: this
process becomes one worker). What a plugin answers is `acc.contract.cluster.ClusterEnvironment`; what a plugin
author imports is `acc.cluster`. Torch-free.
"""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from acc.contract.cluster import CLUSTER_GROUP, ClusterEnvironment, ClusterError
from acc.errors import ConfigError, PluginError, PluginLoadError, ValidationError

if TYPE_CHECKING:
    from acc.assembly.plugins import PluginInfo

# ClusterEnvironment field -> the kernel setting it provides
SETTINGS = {"num_machines": "num_machines", "machine_rank": "machine_rank", "main_address": "main_process_ip",
            "main_port": "main_process_port", "nproc": "nproc"}
# the allocation's facts: a flag or variable may not say otherwise. Where machine 0 listens is a choice (a flag
# or ACC_* variable may name another interface of it, or another port), so it is overridden, not contradicted.
FACTS = ("num_machines", "machine_rank", "nproc")


# --------------------------------------------------------------------------- asking the plugins


def installed_clusters() -> dict[str, "PluginInfo"]:
    """Installed cluster-environment plugins by name (entry-point metadata only, nothing imported)."""
    from acc.assembly.plugins import _discover

    return dict(sorted(_discover(CLUSTER_GROUP).items()))


def cluster_manager(blocked: Iterable[str] = ()) -> Any:
    """A plugin manager with every installed cluster-environment plugin but the blocked ones (`-p no:NAME`)."""
    from acc.assembly.plugins import new_plugin_manager, register

    pm = new_plugin_manager()
    skip = set(blocked)
    for name, info in installed_clusters().items():
        if name in skip:
            continue
        try:
            register(pm, info.load_module(), name)
        except PluginLoadError as exc:
            raise PluginLoadError(f"{exc} (cluster environment '{name}'; -p no:{name} turns it off)") from None
    return pm


def detect(environ: Mapping[str, str], hostname: str | None = None, blocked: Iterable[str] = (),
           pm: Any = None) -> ClusterEnvironment | None:
    """The active cluster environment, or None. Every plugin is asked; the highest precedence wins and the
    others are named in `also_active`. Two active at the same precedence is an error naming both. A plugin whose
    variables describe no launch is an error only when no other plugin describes one (mpirun in the batch script
    of a SLURM job: mpirun started the processes, SLURM's own view of the batch script does not matter)."""
    pm = cluster_manager(blocked) if pm is None else pm
    hostname = socket.gethostname() if hostname is None else hostname
    found: list[ClusterEnvironment] = []
    errors: list[tuple[str, str]] = []
    for impl in pm.hook.acc_cluster_environment.get_hookimpls():
        name = impl.plugin_name
        try:
            answer = impl.function(environ=environ, hostname=hostname)
        except ConfigError as exc:
            errors.append((name, f"cluster environment '{name}': {exc} (-p no:{name} ignores this scheduler)"))
            continue
        if answer is None:
            continue
        if not isinstance(answer, ClusterEnvironment):
            raise PluginError(f"cluster environment '{name}' answered acc_cluster_environment with "
                              f"{type(answer).__name__}, not an acc.cluster.ClusterEnvironment")
        answer = replace(answer, name=name)
        problems = answer.problems()
        if problems:
            errors.append((name, f"cluster environment '{name}' ({answer.label}) describes no launch: "
                                 + "; ".join(problems)))
            continue
        found.append(answer)
    if not found:
        if errors:
            raise ClusterError(errors[0][1])
        return None
    found.sort(key=lambda e: -e.precedence)
    best = found[0]
    ties = [e for e in found[1:] if e.precedence == best.precedence]
    if ties:
        raise ClusterError(f"two cluster environments are active at once: '{best.name}' ({best.label}) and "
                           f"'{ties[0].name}' ({ties[0].label}), and neither is more specific; turn one off with "
                           f"-p no:{ties[0].name} (or -p no:{best.name})")
    return replace(best, also_active=tuple(f"{e.name} ({e.label})" for e in found[1:])
                   + tuple(f"{name} (its variables describe no launch)" for name, _ in errors))


def setting_values(env: ClusterEnvironment | None) -> dict[str, tuple[Any, str]]:
    """The settings the environment provides: name -> (value, source), for `acc.assembly.settings.resolve(cluster=...)`."""
    if env is None:
        return {}
    out = {}
    for attr, setting in SETTINGS.items():
        value = getattr(env, attr)
        if value is not None:
            out[setting] = (value, env.source(attr))
    return out


def contradictions(settings: Any, env: ClusterEnvironment | None) -> list[str]:
    """A flag or ACC_* variable that disagrees with the scheduler's facts (machines, this machine's rank, processes
    per machine where it fixes them), one message each, both values named."""
    if env is None:
        return []
    out = []
    for name, (value, source) in setting_values(env).items():
        if name not in FACTS:
            continue
        given = settings.source(name)
        if not given.startswith(("flag ", "env ", "argument ")) or settings[name] == value:
            continue
        where = given.split(" ", 1)[1]
        if name == "nproc" and env.per_process:
            fix = (f"{env.name} started {value} processes on each machine itself, one per task, so acc launch runs "
                   f"each as one worker: leave out {where}, or start one task per machine so that acc launch starts "
                   f"{settings[name]} itself")
        else:
            fix = (f"leave out {where} (acc reads it from {env.name}), change the allocation, or ignore the "
                   f"scheduler with -p no:{env.name}")
        out.append(f"{name} {settings[name]} (from {given}) contradicts {env.label}: {value} (from {source}); {fix}")
    return out


def check(settings: Any, env: ClusterEnvironment | None) -> None:
    """Raise ValidationError listing every contradiction between the settings and the scheduler."""
    problems = contradictions(settings, env)
    if problems:
        raise ValidationError(problems)


def kernel_problems(settings: Any, env: ClusterEnvironment | None) -> list[str]:
    """What one process per task cannot run: restarts (the scheduler started the processes, acc launch cannot
    restart them), and tasks that see fewer GPUs than the machine runs tasks (each takes cuda:<local rank>)."""
    if env is None or not env.per_process:
        return []
    from acc.assembly.hardware import visible_cuda_devices

    out = []
    if settings["max_restarts"]:
        out.append(f"max_restarts {settings['max_restarts']} (from {settings.source('max_restarts')}): {env.name} "
                   "started every process itself (one task per process), so acc launch cannot restart them; leave it "
                   "out (a scheduler restarts jobs itself), or start one task per machine so that acc launch starts "
                   "the processes")
    cuda = visible_cuda_devices()
    if cuda and not settings["cpu"] and cuda < settings["nproc"]:
        out.append(f"{env.name} started {settings['nproc']} processes on this machine, one per task, but this task "
                   f"sees {cuda} CUDA device(s); each task takes cuda:<local rank> of the machine's devices, so let "
                   "every task see all of them (no per-task GPU binding), or start one task per machine")
    return out




__all__ = ["CLUSTER_GROUP", "check", "cluster_manager", "contradictions", "detect",
           "installed_clusters", "kernel_problems", "setting_values"]
