"""Every hook a plugin may implement. This module is the contract; `HOOKSPEC_VERSION` versions it.

A plugin is a module (or object) of functions marked `@acc.backend.hookimpl`, named after the specs below, and
a module attribute `ACC_HOOKSPEC_VERSION` equal to the version it was written against (2; version-1 plugins
still load, with a deprecation warning, through acc 0.x). Backends import only `acc.backend` (the SDK).

Kinds:
- **selection**: exactly one implementation answers: the chosen backend's if it implements the hook, else the
  builtin `cpu` backend's (the default). Its answer is taken as is, None included: a hook need not return a
  sentinel to say "done". The kernel refuses a plugin set in which two non-default plugins implement the same
  selection hook, naming both.
- **broadcast**: every plugin's answer is collected (a list, in pluggy's call order).
- Cross-cutting plugins (timing, logging) wrap any hook with `@hookimpl(wrapper=True)`; a wrapper does not
  count as an answer. `hookwrapper=True` (old style) is refused. Mixed precision is kernel code, not a
  wrapper (a wrapper can neither change the loss a backward hook receives nor skip a step).
- The collectives are not hooks but one object (`acc_communicator`), so a backend provides all or none.

Launcher-side hooks receive `settings` (a `ResolvedSettings`) and must not import torch or a backend's
heavy library: `acc --help`, `acc plugins` and `acc launch --dry-run` stay torch-free. Worker-side hooks
receive `ctx` (a `RunContext`) and run inside each training process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ContextManager, Mapping

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from acc.contract.capabilities import Capabilities
    from acc.contract.cluster import ClusterEnvironment
    from acc.contract.communicator import Communicator
    from acc.contract.context import ProcessInfo, RunContext
    from acc.contract.detection import Detection
    from acc.contract.launch_plan import LaunchPlan
    from acc.contract.settings import ResolvedSettings, ScopedRegistry
    from acc.contract.sharded_build import ShardedBuild

PROJECT = "acc"
HOOKSPEC_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)  # version 1 (six collective hooks, boxed answers) is deprecated

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# Hooks where exactly one answer is taken; the kernel checks no two non-default plugins answer one.
SELECTION_HOOKS = (
    "acc_launch_plan",
    "acc_setup",
    "acc_wrap",
    "acc_wrap_dataloader",
    "acc_unwrap_model",
    "acc_no_sync",
    "acc_backward",
    "acc_optimizer_step",
    "acc_clip_grad_norm",
    "acc_grad_scaler",
    "acc_communicator",
    "acc_capabilities",
    "acc_save_checkpoint",
    "acc_load_checkpoint",
    "acc_model_state_dict",
    "acc_merge_weights",
    "acc_init_module",
)

# Version 1's collectives, one hook each (a version-1 backend implements all six or none; the kernel wraps
# them into a Communicator). Version 2 backends answer acc_communicator instead.
V1_COLLECTIVE_HOOKS = ("acc_all_reduce", "acc_all_gather", "acc_gather_object", "acc_broadcast",
                       "acc_broadcast_object", "acc_barrier")
V2_ONLY_HOOKS = ("acc_communicator", "acc_capabilities", "acc_init_module")


# --------------------------------------------------------------------------- launcher side (torch-free)


@hookspec
def acc_add_settings(registry: "ScopedRegistry") -> None:
    """Declare this plugin's settings.

    :param registry: call ``registry.add(acc.Setting(...))`` once per setting; the plugin is recorded as
        its owner, so config files take its keys under a ``[<plugin name>]`` table.

    **Kind**: broadcast.
    **Called by**: the settings resolver, in the launcher (before argument parsing, so declared flags
    become ``acc launch`` options) and in each worker; no torch may be imported.
    **Default**: the kernel declares ``backend``, ``nproc``, ``plugins``, ``mixed_precision``, ... itself.
    """


@hookspec
def acc_validate(settings: "ResolvedSettings") -> list[str] | None:
    """Report problems with the resolved settings, e.g. an option combination this backend cannot run.

    :param settings: the resolved settings (values and their sources).
    :return: a list of messages (each saying what was given, what is valid and the fix), or None.

    **Kind**: broadcast; the kernel gathers every plugin's problems and reports them all at once.
    **Called by**: ``acc launch`` after resolution and before ``acc_launch_plan``; torch-free.
    **Default**: cpu objects to more than one process or machine.
    """


@hookspec(firstresult=True)
def acc_launch_plan(settings: "ResolvedSettings") -> "LaunchPlan | None":
    """Say how to start this backend's processes.

    :param settings: the resolved settings.
    :return: a ``LaunchPlan`` (engine, processes per machine, rendezvous, extra environment).

    **Kind**: selection.
    **Called by**: ``acc launch`` (and ``--dry-run``), once, in the launcher; torch-free.
    **Default**: cpu plans one plain process (engine ``process``).
    """


@hookspec
def acc_detect(settings: "ResolvedSettings") -> "Detection | None":
    """Say how well this backend fits the machine, for choosing a backend when the user did not.

    :return: ``acc.contract.detection.Detection(backend, score, nproc, reason)`` (score: higher fits better; the cpu
        backend answers 1; a backend that does not fit returns None). Use ``acc.assembly.hardware`` (torch-free).

    **Kind**: broadcast, over every installed backend at once (only this hook is called on that set).
    **Called by**: ``acc launch`` when no backend was given by flag, environment or config file, and ``acc config``.
    **Default**: cpu answers score 1, one process.
    """


@hookspec
def acc_config_questions(settings: "ResolvedSettings") -> list[str] | None:
    """Name the settings ``acc config`` should ask about when this backend is chosen, in order.

    :return: setting names this plugin declared (the kernel asks with their help, choices and defaults).

    **Kind**: broadcast (the chosen backend and the extra plugins answer).
    **Called by**: ``acc config``, in the launcher, after the backend question; torch-free.
    **Default**: cpu asks nothing more.
    """


@hookspec
def acc_env_report(settings: "ResolvedSettings") -> dict[str, str] | None:
    """Facts for bug reports: library versions, hardware this plugin can see.

    :return: a mapping of label to value, shown under the plugin's name by ``acc env``.

    **Kind**: broadcast.
    **Called by**: ``acc env``, in the launcher process; may import torch or the plugin's library.
    **Default**: cpu reports torch's version and the CPU/CUDA devices torch sees.
    """


@hookspec
def acc_cluster_environment(environ: "Mapping[str, str]", hostname: str) -> "ClusterEnvironment | None":
    """Say whether this plugin's scheduler started this process, and what it knows about the launch.

    :param environ: the launcher's environment variables (read them here, never ``os.environ``: tests pass
        recorded environments).
    :param hostname: this machine's host name (``socket.gethostname()``), for schedulers that list hosts.
    :return: an ``acc.cluster.ClusterEnvironment`` (machines, this machine's rank, main address and port, and,
        where the scheduler started every process itself, processes per machine and this process's ranks), or
        None when the scheduler is not active. Raise ``acc.cluster.ClusterError`` when its variables are there
        but describe no launch (say which variables, what they held, and the fix).

    **Kind**: broadcast, over the cluster-environment plugins only (entry-point group ``acc.clusters``); the
    active answer of highest ``precedence`` is used, and its values become the settings source between ``ACC_*``
    variables and config files (flag > env > cluster > file > default); a flag that contradicts it is an error.
    **Called by**: ``acc launch`` (and ``--dry-run``), in the launcher, before settings are resolved; torch-free.
    **Default**: none: acc-core knows no scheduler (acc-clusters provides slurm, kubeflow, lsf and mpi).
    """


@hookspec(firstresult=True)
def acc_capabilities(settings: "ResolvedSettings") -> "Capabilities | None":
    """Say what this backend promises about training (``acc.backend.Capabilities``): how replicas synchronise
    (every step, every k steps), whether its state is replicated or sharded, whether its checkpoints load on
    another number of processes, the DistributedType it runs as and the mixed-precision modes it runs.

    :param settings: the resolved settings (the promises may depend on them, e.g. a sync period setting).
    :return: a ``Capabilities``.

    **Kind**: selection (version 2); torch-free.
    **Called by**: ``acc launch --dry-run`` (shown), ``acc check`` and the conformance kit (which hold the
    backend to them), and each worker.
    **Default**: cpu promises one process: ``Capabilities(sync="none", distributed_type="NO")``.
    """


# --------------------------------------------------------------------------- worker side: setup


@hookspec(firstresult=True)
def acc_setup(ctx: "RunContext") -> "ProcessInfo | None":
    """Prepare this process: join the process group, choose the device.

    :param ctx: the run context; ``ctx.settings`` holds the resolved settings.
    :return: a ``ProcessInfo`` (device, world size, this process's global and local index).

    **Kind**: selection.
    **Called by**: ``Accelerator.__init__``, once, on every process.
    **Default**: cpu returns one process on the CPU, or on the single visible CUDA device.
    """


@hookspec
def acc_teardown(ctx: "RunContext") -> None:
    """Release what setup acquired (process groups, engines); print end-of-run summaries.

    **Kind**: broadcast.
    **Called by**: ``Accelerator.end_training``, on every process.
    **Default**: cpu has nothing to release.
    """


# --------------------------------------------------------------------------- worker side: build


@hookspec(firstresult=True)
def acc_init_module(ctx: "RunContext", empty_init: bool | None) -> "ShardedBuild | None":
    """How models built inside ``with accelerator.init_module():`` come to exist on this backend.

    :param ctx: the run context, after ``acc_setup``.
    :param empty_init: the script's argument: None (the backend decides), True (the weights will be loaded:
        initialising them may be skipped).
    :return: an ``acc.backend.ShardedBuild`` (its ``context()`` is entered around the construction; ``part`` and
        ``store`` say which range of each parameter this process keeps and put a value there, which is how
        ``acc.load_checkpoint_in_model`` reads only this process's part of a checkpoint), or None for a normal
        build. ``acc.backend.MetaBuild`` builds on the meta device and initialises part by part (for backends that
        shard after building); a build with ``materializes_meta`` lets ``prepare`` hand the backend models whose
        parameters are on the meta device (others are refused before ``acc_wrap``).

    **Kind**: selection (version 2).
    **Called by**: ``Accelerator.init_module``, on every process, each time the context is entered (not for
    ``empty_init=False``, which asks for a normal build); ``Accelerator.prepare`` when a model has meta parameters.
    **Default**: cpu answers None: a normal build (each process holds the whole model, as it trains it); so does
    every backend that does not implement the hook.
    """


# --------------------------------------------------------------------------- worker side: wrap


@hookspec(firstresult=True)
def acc_wrap(ctx: "RunContext", models: list[Any], optimizers: list[Any]) -> "tuple[list[Any], list[Any]] | None":
    """Wrap the models and optimizers of one ``prepare`` call for this backend.

    :param models: ``torch.nn.Module`` objects, already on ``ctx.device``.
    :param optimizers: the user's ``torch.optim.Optimizer`` objects (unwrapped); the models prepared in
        earlier ``prepare`` calls are in ``ctx.backend_state.get("models")`` if the backend keeps them.
    :return: ``(models, optimizers)``, same lengths and order. A backend that must rebuild parameters
        (sharding) rebinds the optimizers to the new parameters here.

    **Kind**: selection.
    **Called by**: ``Accelerator.prepare``, on every process, once per call that has models/optimizers.
    **Default**: cpu returns both lists unchanged.
    """


@hookspec(firstresult=True)
def acc_wrap_dataloader(ctx: "RunContext", loader: Any) -> Any:
    """Adapt a prepared data loader (already sharded and device-placing) for this backend.

    :param loader: the kernel's prepared loader for this process.
    :return: an iterable of batches to hand to the user (usually ``loader`` itself).

    **Kind**: selection.
    **Called by**: ``Accelerator.prepare``, on every process, for each data loader.
    **Default**: cpu returns ``loader`` unchanged.
    """


@hookspec(firstresult=True)
def acc_unwrap_model(ctx: "RunContext", model: Any) -> Any:
    """Return the user's module from the backend's wrapper.

    **Kind**: selection.
    **Called by**: ``Accelerator.unwrap_model`` and the checkpoint code, on any process.
    **Default**: cpu returns ``model`` unchanged.
    """


@hookspec(firstresult=True)
def acc_no_sync(ctx: "RunContext", model: Any) -> "ContextManager[Any] | None":
    """A context manager in which backward does not synchronise gradients across processes.

    **Kind**: selection.
    **Called by**: ``Accelerator.accumulate`` / ``no_sync`` on every process, on non-sync micro-steps.
    **Default**: cpu returns a null context (one process has nothing to synchronise).
    """


# --------------------------------------------------------------------------- worker side: backward and step


@hookspec(firstresult=True)
def acc_backward(ctx: "RunContext", loss: Any, kwargs: dict[str, Any]) -> Any:
    """Compute gradients of ``loss``.

    :param loss: the (already accumulation-scaled) loss tensor.
    :param kwargs: keyword arguments the user passed to ``Accelerator.backward``.
    :return: nothing (version 1 returned ``True``; both are fine).

    **Kind**: selection.
    **Called by**: ``Accelerator.backward``, on every process, every micro-step.
    **Default**: cpu calls ``loss.backward(**kwargs)``.
    """


@hookspec(firstresult=True)
def acc_optimizer_step(ctx: "RunContext", optimizer: Any) -> bool | None:
    """Apply one optimizer step.

    :param optimizer: the user's optimizer (unwrapped).
    :return: True if the step was applied, False if it was skipped (e.g. fp16 overflow).

    **Kind**: selection.
    **Called by**: the prepared optimizer's ``step()``, on every process, on gradient-sync steps only.
    **Default**: cpu calls ``optimizer.step()`` and returns True.
    """


@hookspec(firstresult=True)
def acc_clip_grad_norm(ctx: "RunContext", parameters: list[Any], max_norm: float, norm_type: float) -> Any:
    """Clip gradients to a total norm across all processes and return that total norm (a tensor).

    **Kind**: selection; sharded backends answer because each rank holds part of the norm.
    **Called by**: ``Accelerator.clip_grad_norm_``, on every process.
    **Default**: cpu calls ``torch.nn.utils.clip_grad_norm_``.
    """


@hookspec(firstresult=True)
def acc_grad_scaler(ctx: "RunContext", kwargs: dict[str, Any]) -> Any:
    """The gradient scaler for fp16 mixed precision.

    :param kwargs: the user's ``GradScalerKwargs`` as a dict (may be empty).
    :return: an object with GradScaler's interface (``scale``, ``unscale_``, ``step``, ``update``,
        ``get_scale``, ``state_dict``, ``load_state_dict``). Sharded backends return a scaler that agrees
        on overflow across processes.

    **Kind**: selection.
    **Called by**: ``Accelerator.__init__``, on every process, once, when mixed_precision is "fp16" and the
    backend did not report ``native_precision``.
    **Default**: cpu returns ``torch.amp.GradScaler(ctx.device.type, **kwargs)``.
    """


# --------------------------------------------------------------------------- worker side: collectives


@hookspec(firstresult=True)
def acc_communicator(ctx: "RunContext") -> "Communicator | None":
    """The collectives of this run: an object with all six methods of ``acc.backend.Communicator``
    (``all_reduce``, ``all_gather``, ``gather_object``, ``broadcast``, ``broadcast_object``, ``barrier``).

    :param ctx: the run context, after ``acc_setup``.
    :return: a ``Communicator``; backends on torch.distributed return ``acc.backend.TorchDistributed()``.

    **Kind**: selection (version 2).
    **Called by**: the kernel, once per process, right after ``acc_setup``. An object lacking a method is an error
    naming it; a multi-process run whose backend answers with the single-process default is an error too.
    **Default**: cpu answers ``LocalCommunicator()`` (every collective the identity).
    """


# --------------------------------------------------------------------------- worker side: reduce (version 1)
# The six collective hooks of contract version 1, kept for version-1 backends (deprecated): the kernel wraps
# a version-1 backend's implementations into a Communicator (and refuses a backend that has some but not all).


@hookspec(firstresult=True)
def acc_all_reduce(ctx: "RunContext", tensor: Any, op: str) -> Any:
    """Reduce ``tensor`` across processes; ``op`` is one of "sum", "mean", "max", "min".

    :return: the reduced tensor (same shape), identical on every process.

    **Kind**: selection.
    **Called by**: ``Accelerator.reduce`` and kernel code, on every process at the same point.
    **Default**: cpu returns ``tensor`` (one process: the reduction is the identity).
    """


@hookspec(firstresult=True)
def acc_all_gather(ctx: "RunContext", tensor: Any) -> Any:
    """Concatenate equally-shaped tensors from every process along dim 0, in process order.

    **Kind**: selection.
    **Called by**: ``Accelerator.gather`` (after the kernel padded shapes to agree), on every process.
    **Default**: cpu returns ``tensor``.
    """


@hookspec(firstresult=True)
def acc_gather_object(ctx: "RunContext", obj: Any) -> list[Any] | None:
    """Collect one picklable object from every process: a list indexed by process.

    **Kind**: selection.
    **Called by**: ``Accelerator.gather_object`` and kernel code, on every process.
    **Default**: cpu returns ``[obj]``.
    """


@hookspec(firstresult=True)
def acc_broadcast(ctx: "RunContext", tensor: Any, src: int) -> Any:
    """Return process ``src``'s tensor on every process (same shape everywhere).

    **Kind**: selection.
    **Called by**: ``Accelerator.broadcast``, on every process.
    **Default**: cpu returns ``tensor``.
    """


@hookspec(firstresult=True)
def acc_broadcast_object(ctx: "RunContext", obj: Any, src: int) -> Any:
    """Return process ``src``'s picklable object on every process.

    **Kind**: selection. Answer with a one-element list ``[value]`` so that a broadcast
    value of None is still an answer; the kernel unwraps it.
    **Called by**: ``Accelerator.broadcast_object`` and kernel code (e.g. shared shuffling seeds).
    **Default**: cpu returns ``[obj]``.
    """


@hookspec(firstresult=True)
def acc_barrier(ctx: "RunContext") -> bool | None:
    """Block until every process has reached this point; return True.

    **Kind**: selection.
    **Called by**: ``Accelerator.wait_for_everyone`` and ``main_process_first``.
    **Default**: cpu returns True at once.
    """


# --------------------------------------------------------------------------- worker side: save and load


@hookspec(firstresult=True)
def acc_save_checkpoint(ctx: "RunContext", directory: Any, models: list[Any], optimizers: list[Any]) -> list[str] | None:
    """Write the models' and optimizers' state into ``directory`` (a ``pathlib.Path`` that exists).

    Sharded backends write their shards from every process; others write from the main process only.
    Tensors go to safetensors or ``torch.save`` files that ``torch.load(weights_only=True)`` can read
    (``acc.checkpointing.files.save_tensors`` / ``save_object``): loading must never need to run code.

    :param models: the user's modules (unwrapped), in prepare order.
    :param optimizers: the user's optimizers (unwrapped), in prepare order.
    :return: the file names (relative to ``directory``) this process wrote; the kernel lists them, with
        sizes and checksums, in the checkpoint's manifest.

    **Kind**: selection.
    **Called by**: ``Accelerator.save_state``, on every process, before the kernel writes its own files.
    **Default**: cpu writes ``model_<i>.safetensors`` and ``optimizer_<i>.pt`` from the main process.
    """


@hookspec(firstresult=True)
def acc_load_checkpoint(ctx: "RunContext", directory: Any, models: list[Any], optimizers: list[Any],
                        manifest: dict[str, Any]) -> bool | None:
    """Restore the models' and optimizers' state from ``directory`` (return nothing; version 1 returned True).

    :param manifest: the checkpoint's manifest; check each file with ``acc.checkpointing.files.verify(directory,
        manifest, name)`` before reading it, and read with ``load_tensors`` / ``load_object``.

    **Kind**: selection.
    **Called by**: ``Accelerator.load_state``, on every process.
    **Default**: cpu reads the files its ``acc_save_checkpoint`` wrote (no code is executed on load).
    """


@hookspec(firstresult=True)
def acc_model_state_dict(ctx: "RunContext", model: Any) -> dict[str, Any] | None:
    """The full (unsharded) state dict of the user's model, as CPU tensors, complete on the main process.

    **Kind**: selection. Non-main processes may return an empty dict.
    **Called by**: ``Accelerator.get_state_dict`` / ``save_model``, on every process (it may be collective).
    **Default**: cpu returns the unwrapped model's ``state_dict()``.
    """


# --------------------------------------------------------------------------- offline: acc merge-weights


@hookspec(firstresult=True)
def acc_merge_weights(directory: Any, manifest: dict[str, Any], index: int, out: Any) -> list[str] | None:
    """Write the full weights of prepared model ``index`` of a checkpoint this backend saved into one
    safetensors file ``out`` (loadable into the plain model); return the tensor names written.

    Offline: no process group, torch may be imported. ``directory`` is verified by the caller's manifest;
    verify each file you read with ``verify(directory, manifest, name)``.

    **Kind**: selection (the backend that saved the checkpoint, from its manifest).
    **Called by**: ``acc merge-weights CHECKPOINT OUT``.
    **Default**: cpu merges the SDK's piece files (``save_pieces`` with model tensors named
    ``model_prefix(index) + key``, as fsdp writes them); a checkpoint whose model is one file already is refused
    with its path.
    """
