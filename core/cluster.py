"""acc's cluster-environment SDK: what a scheduler already knows about a launch, so nobody types it again.

A cluster environment is a plugin in the entry-point group `acc.clusters` that implements
`acc_cluster_environment(environ, hostname)` (launcher side, torch-free) and answers, when its scheduler started
this process, with a `ClusterEnvironment`: the machines of the run, this machine's rank, where machine 0 is and,
where the scheduler started every training process itself (one task per process), the processes per machine and
this process's ranks. acc-core knows no scheduler: SLURM, Kubeflow/torchrun-style variables, LSF and MPI are the
plugins of `acc-clusters` (plugins/clusters); anyone can publish another.

A plugin imports this module and nothing else of acc: `from acc.cluster import ClusterEnvironment, ClusterError,
hookimpl`. The kernel's side (asking the plugins: `detect`, `setting_values`, `contradictions`, `check`,
`kernel_problems`, `task_plan`) lives in `acc.assembly.clusters` and is handed on here by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from acc.compat import lazy_names
from acc.contract.cluster import CLUSTER_GROUP, ClusterEnvironment, ClusterError
from acc.contract.hookspecs import HOOKSPEC_VERSION, hookimpl

_LAZY = {**{name: ("acc.assembly.clusters", name) for name in (
    "check", "cluster_manager", "contradictions", "detect", "installed_clusters", "kernel_problems", "setting_values")},
    "task_plan": ("acc.launcher.plans", "task_plan")}

if TYPE_CHECKING:  # pragma: no cover
    from acc.assembly.clusters import (
        check,
        cluster_manager,
        contradictions,
        detect,
        installed_clusters,
        kernel_problems,
        setting_values,
    )
    from acc.launcher.plans import task_plan


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return lazy_names.resolve(globals(), _LAZY, name)
    raise AttributeError(f"module 'acc.cluster' has no attribute {name!r}")


__all__ = ["CLUSTER_GROUP", "HOOKSPEC_VERSION", "ClusterEnvironment", "ClusterError", "check", "cluster_manager",
           "contradictions", "detect", "hookimpl", "installed_clusters", "kernel_problems", "setting_values",
           "task_plan"]
