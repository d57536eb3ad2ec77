"""One per process: the plugin set, the run context and the backend set up (`acc_setup`).

An `Accelerator` builds one; so does `PartialState()` in a script without an Accelerator (an inference
script), which is how it sets up the process group. `acc.state`'s objects and the free collectives of
`acc.utils` are views of the current runtime, never a second copy of its facts.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Mapping

import pluggy

from acc.assembly.choose import Assembly
from acc.assembly.handoff import assemble_worker
from acc.assembly.plugins import BackendHooks, plugin_version
from acc.contract.communicator import COLLECTIVES, LocalCommunicator, missing_collectives
from acc.contract.context import RunContext
from acc.contract.enums import DistributedType, as_distributed_type
from acc.contract.kwargs import InitProcessGroupKwargs
from acc.errors import AccError
from acc.runtime import lifecycle
from acc.runtime.collectives import CollectivesMixin
from acc.runtime.communicators import HookCommunicator
from acc.runtime.parallelism import check_parallelism, device_mesh

_CURRENT: dict[str, "Runtime | None"] = {"runtime": None}


def _backend_of_code(assembly: Assembly, backend_plugins: list, parallelism_config: Any) -> Assembly:
    """Accelerate trains with FSDP (DeepSpeed) when a script gives its Accelerator a FullyShardedDataParallelPlugin
    (DeepSpeedPlugin), and tensor-parallel when its ParallelismConfig says so, whatever the launch chose. This worker
    switches backend likewise: to the plugin's, or, when the launch's backend cannot drive a dimension the config
    asks for, to an installed backend that drives them all (fsdp first). Only where the processes were started by
    a launcher (the engine ddp, fsdp and deepspeed share) and the backend is installed. A backend chosen explicitly at
    launch is overridden by a plugin with a warning, as other settings given in code are, and never for a config (its
    error names the backends that drive the dimension); a detected one says so in one line on rank 0."""
    import os

    from acc.assembly.handoff import with_backend
    from acc.assembly.plugins import declared_capabilities
    from acc.errors import PluginNotFoundError
    from acc.runtime.arguments import note_once
    from acc.runtime.distributed import LAUNCHER_VARS
    from acc.runtime.parallelism import DIMS, backends_driving

    settings = assembly.settings
    launched, source = settings["backend"], settings.source("backend")
    chosen = not (settings.is_default("backend") or source == "detected")
    if any(v not in os.environ for v in LAUNCHER_VARS):
        return assembly
    wanted = {plugin.backend for plugin in backend_plugins}
    if wanted:
        if len(wanted) != 1 or launched in wanted:
            return assembly
        backend = wanted.pop()
        given = f"Accelerator({type(backend_plugins[0]).__name__}(...))"
    else:
        dims = [d for d in DIMS if int(getattr(parallelism_config, f"{d}_size", 1) or 1) > 1]
        drives = set(declared_capabilities(assembly.pm, settings).mesh_dims) if dims else set()
        if chosen or not dims or set(dims) <= drives:
            return assembly
        able = set.intersection(*(set(backends_driving(d, settings)) for d in dims))
        if not able:
            return assembly
        backend = "fsdp" if "fsdp" in able else sorted(able)[0]
        given = f"Accelerator(parallelism_config=ParallelismConfig({', '.join(f'{d}_size>1' for d in dims)}))"
    try:
        switched = with_backend(assembly, backend, f"code {given}")
    except PluginNotFoundError:
        return assembly
    if chosen:
        warnings.warn(f"{given} selects the {backend} backend over backend={launched!r} from {source} (Accelerate "
                      f"uses {backend} when its plugin is given)", stacklevel=4)
    else:
        note_once("backend-of-code", f"{given} selects the {backend} backend, as Accelerate trains it (the launch "
                  f"had {source} {launched}; --backend {backend} says it there)", os.environ.get("RANK") == "0")
    if os.environ.get("LOCAL_RANK") == "0":  # one run directory per machine
        from acc.assembly import manifest

        manifest.record_backend_switch(os.environ.get(manifest.RUN_DIR_ENV), backend, switched.plugin_versions(),
                                       launched, given)
    return switched


class Runtime(CollectivesMixin):
    """The set-up backend of this process. `code` holds settings given in code (name -> value, None: not given),
    applied over the launch settings with a warning where they contradict one that was set explicitly."""

    def __init__(self, code: Mapping[str, Any] | None = None, kwargs_handlers: list | None = None,
                 plugin_manager: pluggy.PluginManager | None = None, where: str = "Accelerator",
                 backend_plugins: list | None = None, parallelism_config: Any = None):
        assembly = assemble_worker(pm=plugin_manager)
        if plugin_manager is None:
            assembly = _backend_of_code(assembly, list(backend_plugins or []), parallelism_config)
        settings = assembly.settings
        code = dict(code or {})
        self.backend_plugins: list = []  # the ones this run's backend applies (Accelerate's state shows them)
        for plugin in backend_plugins or []:  # Accelerate's DeepSpeedPlugin / FullyShardedDataParallelPlugin
            name = type(plugin).__name__
            if plugin.backend != settings["backend"]:
                warnings.warn(f"Accelerator({name}(...)) is ignored: this run uses the {settings['backend']} backend "
                              f"(Accelerate ignores it too without {plugin.backend}); launch with --backend "
                              f"{plugin.backend} to use it", stacklevel=3)
                continue
            self.backend_plugins.append(plugin)
            for key, value in plugin.to_settings().items():
                code.setdefault(key, value)
        for name, value in code.items():
            if value is None:
                continue
            setting = assembly.registry[name]
            try:
                value = setting.convert(value)
            except ValueError as exc:
                raise AccError(f"{where}({name}={value!r}): {exc}") from None
            if not settings.is_default(name) and settings[name] != value:
                warnings.warn(f"{where}({name}={value!r}) overrides {name}={settings[name]!r} from "
                              f"{settings.source(name)}", stacklevel=3)
            settings = settings.override(name, value, f"code {where}({name}=...)", assembly.registry)
        self.assembly: Assembly = assembly
        self._pm = assembly.pm
        self.ctx = RunContext(settings=settings, backend=settings["backend"], kwargs_handlers=list(kwargs_handlers or []))
        init = self.ctx.handler(InitProcessGroupKwargs)
        if init is not None and init.timeout_seconds() is not None:
            self.ctx.settings = self.ctx.settings.override("timeout", init.timeout_seconds(),
                                                           "code InitProcessGroupKwargs(timeout=...)")
        self.hooks = BackendHooks(self._pm)
        info = self.hooks.acc_setup(ctx=self.ctx)
        if info is None:
            raise AccError(f"no plugin answered acc_setup for backend '{self.ctx.backend}'")
        self.ctx.process = info
        self.ctx.communicator = self._communicator()
        self.parallelism_config = check_parallelism(parallelism_config, self.ctx.num_processes, self.ctx.backend,
                                                    self.capabilities, self.ctx.settings)
        self.ctx.parallelism = self.parallelism_config
        self.accelerator: Any = None  # the Accelerator built on this runtime, if any (for GradientState)
        self.builds: list[Any] = []  # the ShardedBuilds of init_module() contexts (acc.load_checkpoint_in_model)
        self._ended = False
        lifecycle.install(self.teardown)
        _CURRENT["runtime"] = self

    def _communicator(self) -> Any:
        """The backend's Communicator (a version-1 backend's six collective hooks, wrapped), checked whole."""
        backend = self.ctx.backend
        v1 = self._pm.get_plugin(backend) is not None and plugin_version(self._pm, backend) == 1 and any(
            impl.plugin_name == backend for impl in self._pm.hook.acc_all_reduce.get_hookimpls())
        communicator = HookCommunicator(self.hooks.call, self.ctx) if v1 else \
            self.hooks.acc_communicator(ctx=self.ctx)
        missing = missing_collectives(communicator)
        if missing:
            raise AccError(f"backend '{backend}' answered acc_communicator with {type(communicator).__name__}, which "
                           f"lacks {', '.join(missing)}: a Communicator provides all of "
                           f"{', '.join(COLLECTIVES)} (acc.backend.Communicator)")
        if self.ctx.num_processes > 1 and isinstance(communicator, LocalCommunicator):
            raise AccError(f"backend '{backend}' runs {self.ctx.num_processes} processes but provides no collectives "
                           "(its acc_communicator answer, or the default, is the single-process LocalCommunicator): "
                           "answer acc_communicator with acc.backend.TorchDistributed() or a Communicator of its own")
        return communicator

    # -- facts
    @property
    def settings(self) -> Any:
        return self.ctx.settings

    @property
    def device(self) -> Any:
        return self.ctx.device

    @property
    def num_processes(self) -> int:
        return self.ctx.num_processes

    @property
    def process_index(self) -> int:
        return self.ctx.process_index

    @property
    def local_process_index(self) -> int:
        return self.ctx.local_process_index

    @property
    def distributed_type(self) -> DistributedType | str:
        return as_distributed_type(self.ctx.process.distributed_type)

    @functools.cached_property
    def device_mesh(self) -> Any:
        """The ParallelismConfig's DeviceMesh on this run's process group (None without one, or on one process)."""
        return device_mesh(self.parallelism_config, self.ctx.device, self.ctx.num_processes)

    @functools.cached_property
    def fsdp_plugin(self) -> Any:
        """The FullyShardedDataParallelPlugin of a run on the fsdp backend: the one given to the Accelerator, else one
        with Accelerate's FSDP2 defaults (SHARDED_STATE_DICT); its fsdp_version reads 2, what acc runs."""
        from acc.compat.plugin_objects import FullyShardedDataParallelPlugin

        plugin = next((p for p in self.backend_plugins if isinstance(p, FullyShardedDataParallelPlugin)), None)
        if plugin is None:
            plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
        if plugin.fsdp_version is None:
            plugin.fsdp_version = 2
        if plugin.state_dict_type is None:
            plugin.state_dict_type = "SHARDED_STATE_DICT"
        return plugin

    @functools.cached_property
    def hf_ds_config(self) -> Any:
        """Accelerate's `deepspeed_plugin.hf_ds_config`: the HfDeepSpeedConfig given in the DeepSpeedPlugin (the very
        object, which transformers' Trainer completes before prepare), else one over the run's DeepSpeed config."""
        from acc.compat.deepspeed_config import HfDeepSpeedConfig

        given = next((p.hf_ds_config for p in self.backend_plugins
                      if isinstance(getattr(getattr(p, "hf_ds_config", None), "config", None), dict)), None)
        if given is not None:
            return given
        view = HfDeepSpeedConfig({})
        view.config = self.ctx.backend_config  # the same dict: the user's config until prepare, the engine's after
        view.set_stage_and_offload()
        return view

    def reread_backend_plugins(self) -> None:
        """Read a DeepSpeedPlugin's config object again at prepare, as Accelerate reads it there: transformers'
        Trainer fills its "auto" values (trainer_config_finalize) after the Accelerator is built."""
        import json

        for plugin in self.backend_plugins:
            data = getattr(getattr(plugin, "hf_ds_config", None), "config", None)
            if not isinstance(data, dict) or "deepspeed_config" not in self.ctx.settings:
                continue
            value = json.dumps(data)
            if value != self.ctx.settings["deepspeed_config"]:
                self.ctx.settings = self.ctx.settings.override(
                    "deepspeed_config", value, "code DeepSpeedPlugin(hf_ds_config=...), read again at prepare")
            steps, ours = data.get("gradient_accumulation_steps"), self.ctx.settings["gradient_accumulation_steps"]
            source = self.ctx.settings.source("gradient_accumulation_steps")
            if isinstance(steps, int) and steps != ours and ours == 1 and source.split()[0] in ("default", "code"):
                # Accelerate takes the DeepSpeed config's value over the Accelerator's 1 (transformers' Trainer
                # passes GradientAccumulationPlugin(num_steps=1) and writes its own count into the config)
                warnings.warn(f"gradient accumulation steps: the Accelerator has 1 ({source}), the DeepSpeed config "
                              f"has {steps}; using the DeepSpeed config's, as Accelerate does", stacklevel=4)
                self.ctx.settings = self.ctx.settings.override(
                    "gradient_accumulation_steps", steps, "code DeepSpeedPlugin(hf_ds_config=...) at prepare")

    @functools.cached_property
    def capabilities(self) -> Any:
        """The backend's declared promises (`acc_capabilities`, see acc.contract.capabilities), as the launcher saw them."""
        from acc.assembly.plugins import declared_capabilities

        return declared_capabilities(self._pm, self.ctx.settings)

    @property
    def ended(self) -> bool:
        return self._ended

    def teardown(self) -> None:
        """Release the backend's resources (process groups) once."""
        if not self._ended:
            self._ended = True
            self.hooks.acc_teardown(ctx=self.ctx)


def current() -> Runtime | None:
    """The runtime the last Accelerator (or PartialState) of this process set up, if it is still running."""
    runtime = _CURRENT["runtime"]
    return runtime if runtime is not None and not runtime.ended else None


def forget() -> None:
    """Let the next Accelerator or PartialState set a run up anew (Accelerate's `_reset_state`). The process group
    is kept (a new run joins it again); the forgotten run still ends at exit."""
    runtime = _CURRENT["runtime"]
    if runtime is not None:
        runtime.forgotten = True  # what was made from it (an Accelerator, a PartialState) says so when asked
    _CURRENT["runtime"] = None


def current_or_start(cpu: bool = False, **kwargs: Any) -> Runtime:
    """The current runtime, or a new one set up as an Accelerator would (PartialState's first call)."""
    runtime = current()
    if runtime is not None:
        return runtime
    handlers = []
    if kwargs:
        allowed = {"backend", "init_method", "timeout"}
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise TypeError(f"PartialState() got unexpected keyword argument(s) {', '.join(unknown)}; it takes "
                            f"cpu and the process-group arguments {', '.join(sorted(allowed))}")
        handlers.append(InitProcessGroupKwargs(**kwargs))
    return Runtime({"cpu": True if cpu else None}, handlers, where="PartialState")
