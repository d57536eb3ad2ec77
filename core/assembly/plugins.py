"""The plugin manager: discover installed plugins without importing them, load the chosen set, check it.

Backends are entry points in the group ``acc.backends``; other (cross-cutting) plugins in ``acc.plugins``,
or any importable module named with ``-p``. The builtin ``cpu`` backend is always registered and answers
every selection hook ``trylast``. No module-level manager exists: every run builds its own. Torch-free.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any, Iterable

import importlib_metadata
import pluggy

from acc.assembly.settings import core_settings
from acc.contract import hookspecs
from acc.contract.settings import CORE_OWNER, SettingsRegistry
from acc.errors import PluginConflictError, PluginError, PluginLoadError, PluginNotFoundError, did_you_mean

BACKEND_GROUP = "acc.backends"
PLUGIN_GROUP = "acc.plugins"
BUILTIN_BACKEND = "cpu"
BUILTIN_MODULE = "acc.builtin.cpu"
FIRST_PARTY = ("ddp", "fsdp", "deepspeed", "xla", "mps")


@dataclass(frozen=True)
class PluginInfo:
    """What discovery knows about an installed plugin without importing it."""

    name: str
    group: str
    module: str
    distribution: str
    version: str

    def load_module(self) -> Any:
        try:
            return importlib.import_module(self.module.split(":")[0])
        except Exception as exc:  # an import error of any kind is the plugin's; report it, never swallow it
            raise PluginLoadError(
                f"plugin '{self.name}' ({self.distribution} {self.version}) failed to import "
                f"module {self.module}: {type(exc).__name__}: {exc}"
            ) from exc


def _core_version() -> str:
    from acc.contract.version import __version__

    return __version__


def _discover(group: str) -> dict[str, PluginInfo]:
    found: dict[str, PluginInfo] = {}
    for ep in importlib_metadata.entry_points(group=group):
        dist = ep.dist
        found.setdefault(
            ep.name,
            PluginInfo(ep.name, group, ep.value, dist.name if dist else "?", dist.version if dist else "?"),
        )
    return found


def installed_backends() -> dict[str, PluginInfo]:
    """Installed backends by name (the builtin cpu first), read from entry-point metadata only."""
    builtin = PluginInfo(BUILTIN_BACKEND, BACKEND_GROUP, BUILTIN_MODULE, "acc-core", _core_version())
    return {BUILTIN_BACKEND: builtin, **{k: v for k, v in sorted(_discover(BACKEND_GROUP).items()) if k != "cpu"}}


def installed_plugins() -> dict[str, PluginInfo]:
    """Installed non-backend plugins (group ``acc.plugins``) by name."""
    return dict(sorted(_discover(PLUGIN_GROUP).items()))


def install_hint(name: str) -> str:
    if name in FIRST_PARTY:
        return f"install with: pip install acc-{name}"
    return f"a backend is a package that declares an entry point in the group '{BACKEND_GROUP}'"


def new_plugin_manager() -> pluggy.PluginManager:
    """A manager with acc's hook specs and nothing registered (tests start here)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def register(pm: pluggy.PluginManager, plugin: Any, name: str) -> None:
    """Register one plugin after checking its hook-spec version and hook names; errors name the plugin."""
    version = getattr(plugin, "ACC_HOOKSPEC_VERSION", None)
    if version is None:
        raise PluginLoadError(
            f"plugin '{name}' does not declare the hook-spec version it targets; "
            f"add `ACC_HOOKSPEC_VERSION = {hookspecs.HOOKSPEC_VERSION}` to its module"
        )
    if version not in hookspecs.SUPPORTED_VERSIONS:
        raise PluginLoadError(
            f"plugin '{name}' targets hook-spec version {version!r}, but this acc-core "
            f"({_core_version()}) provides versions {', '.join(map(str, hookspecs.SUPPORTED_VERSIONS))}; "
            "install a release of the plugin built for this acc-core (or an acc-core that matches the plugin)"
        )
    _check_collectives(plugin, name, version)
    if version == 1:
        import warnings

        warnings.warn(
            f"plugin '{name}' targets hook-spec version 1, deprecated (supported through acc 0.x): set "
            "ACC_HOOKSPEC_VERSION = 2, import from acc.backend only, answer acc_communicator with a Communicator "
            "(acc.backend.TorchDistributed() on torch.distributed) instead of the six collective hooks, and drop "
            "the True/[value] answers; see docs/guides/writing-a-backend.md", DeprecationWarning, stacklevel=2)
    known = [n for n in dir(hookspecs) if n.startswith("acc_")]
    for attr in dir(plugin):
        if attr.startswith("acc_") and callable(getattr(plugin, attr)) and attr not in known:
            raise PluginLoadError(
                f"plugin '{name}' defines {attr}(), which is not an acc hook{did_you_mean(attr, known)}; "
                f"hooks are listed in acc.contract.hookspecs (hook-spec version {hookspecs.HOOKSPEC_VERSION})"
            )
    for attr in known:
        fn = getattr(plugin, attr, None)
        opts = getattr(fn, hookspecs.PROJECT + "_impl", None)
        if fn is not None and opts is None:
            raise PluginLoadError(f"plugin '{name}' defines {attr}() without the @acc.hookimpl marker")
        if opts and opts.get("hookwrapper"):
            raise PluginLoadError(
                f"plugin '{name}': {attr} uses hookwrapper=True; acc accepts new-style wrappers only "
                "(@acc.hookimpl(wrapper=True), a generator that returns the result)"
            )
    try:
        pm.register(plugin, name=name)
        pm.check_pending()
    except ValueError as exc:
        raise PluginLoadError(f"plugin '{name}' cannot be registered: {exc}") from exc
    except pluggy.PluginValidationError as exc:
        pm.unregister(name=name)
        raise PluginLoadError(f"plugin '{name}' has an invalid hook: {exc}") from exc


def _implements(plugin: Any, hook: str) -> bool:
    return getattr(getattr(plugin, hook, None), hookspecs.PROJECT + "_impl", None) is not None


def _check_collectives(plugin: Any, name: str, version: int) -> None:
    """Version 2 provides collectives as one object; version 1 as six hooks, all or none."""
    v1 = [h for h in hookspecs.V1_COLLECTIVE_HOOKS if _implements(plugin, h)]
    if version >= 2 and v1:
        raise PluginLoadError(
            f"plugin '{name}' targets hook-spec version {version} but implements {', '.join(v1)}, version 1's "
            "collective hooks; in version 2 a backend answers acc_communicator with a Communicator object "
            "(acc.backend.TorchDistributed() on torch.distributed)")
    if version == 1 and v1 and len(v1) != len(hookspecs.V1_COLLECTIVE_HOOKS):
        missing = [h for h in hookspecs.V1_COLLECTIVE_HOOKS if h not in v1]
        raise PluginLoadError(
            f"plugin '{name}' implements {', '.join(v1)} but not {', '.join(missing)}: a backend provides all six "
            "collectives or none (on several processes the missing one would silently be the single-process "
            "default); in version 2 answer acc_communicator instead")


def plugin_version(pm: pluggy.PluginManager, name: str) -> int:
    """The hook-spec version the registered plugin `name` targets."""
    return int(getattr(pm.get_plugin(name), "ACC_HOOKSPEC_VERSION", hookspecs.HOOKSPEC_VERSION))


def check_selection(pm: pluggy.PluginManager) -> None:
    """Raise PluginConflictError when two non-default plugins answer the same selection hook."""
    for hook_name in hookspecs.SELECTION_HOOKS + hookspecs.V1_COLLECTIVE_HOOKS:
        caller = getattr(pm.hook, hook_name)
        answering = [
            impl.plugin_name
            for impl in caller.get_hookimpls()
            if not impl.wrapper and not impl.hookwrapper and impl.plugin_name != BUILTIN_BACKEND
        ]
        if len(answering) > 1:
            raise PluginConflictError(
                f"hook {hook_name} is answered by both '{answering[0]}' and '{answering[1]}'; exactly one "
                "plugin may answer a selection hook (registration order never picks one). Load only one "
                f"of them (-p no:{answering[1]} blocks a plugin), or make the cross-cutting one a wrapper"
            )


def _load_builtin(pm: pluggy.PluginManager) -> None:
    register(pm, importlib.import_module(BUILTIN_MODULE), BUILTIN_BACKEND)


def load_backend(pm: pluggy.PluginManager, name: str) -> PluginInfo:
    """Import and register the backend `name` (the builtin cpu is registered separately)."""
    backends = installed_backends()
    info = backends.get(name)
    if info is None:
        raise PluginNotFoundError(
            f"backend '{name}' is not installed{did_you_mean(name, list(backends))}; "
            f"installed: {', '.join(backends)}; {install_hint(name)}"
        )
    if name != BUILTIN_BACKEND:
        register(pm, info.load_module(), name)
    return info


def load_plugin(pm: pluggy.PluginManager, spec: str) -> PluginInfo:
    """Import and register an extra plugin: an ``acc.plugins``/``acc.backends`` entry-point name or a module."""
    info = installed_plugins().get(spec) or installed_backends().get(spec)
    if info is not None and info.name == BUILTIN_BACKEND:
        raise PluginError("'cpu' is the builtin default backend and is always loaded; use --backend to choose one")
    if info is None:
        if not module_available(spec):
            names = list(installed_plugins()) + [b for b in installed_backends() if b != BUILTIN_BACKEND]
            raise PluginNotFoundError(
                f"plugin '{spec}' is neither an installed plugin nor an importable module"
                f"{did_you_mean(spec, names)}; installed plugins: {', '.join(names) or '(none)'}", setting="plugins"
            )
        info = PluginInfo(spec, "module", spec, "(module)", "")
    register(pm, info.load_module(), info.name)
    return info


def split_plugin_specs(specs: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split ``-p`` values into (plugins to load, names blocked with ``no:NAME``)."""
    load, blocked = [], []
    for spec in specs:
        (blocked if spec.startswith("no:") else load).append(spec[3:] if spec.startswith("no:") else spec)
    return load, blocked


def build_plugin_manager(backend: str, plugins: Iterable[str] = ()) -> tuple[pluggy.PluginManager, dict[str, PluginInfo]]:
    """Load the builtin cpu, the chosen backend and the extra plugins; check the set. Returns (pm, infos)."""
    load, blocked = split_plugin_specs(plugins)
    if BUILTIN_BACKEND in blocked:
        raise PluginError("-p no:cpu: the builtin cpu backend supplies the defaults and cannot be blocked")
    if backend in blocked:
        raise PluginError(f"backend '{backend}' is chosen with --backend but blocked with -p no:{backend}")
    pm = new_plugin_manager()
    for name in blocked:
        pm.set_blocked(name)
    _load_builtin(pm)
    infos = {BUILTIN_BACKEND: installed_backends()[BUILTIN_BACKEND]}
    if backend != BUILTIN_BACKEND:
        infos[backend] = load_backend(pm, backend)
    for spec in load:
        if spec in blocked or spec in infos:
            continue
        infos[spec] = load_plugin(pm, spec)
    check_selection(pm)
    return pm, infos


def detection_manager() -> tuple[pluggy.PluginManager, set[str]]:
    """Every installed backend registered at once, for `acc_detect` only (no selection check: nothing else is
    called on this set). A backend that fails to import is left out (`acc plugins` shows why)."""
    pm = new_plugin_manager()
    _load_builtin(pm)
    names = {BUILTIN_BACKEND}
    for name, info in installed_backends().items():
        if name == BUILTIN_BACKEND:
            continue
        try:
            register(pm, info.load_module(), name)
        except PluginError:
            continue
        names.add(name)
    return pm, names


def selection_caller(pm: pluggy.PluginManager, name: str) -> Any:
    """A callable(**kwargs) for the selection hook `name`: exactly one implementation runs, the chosen backend's
    if it has one, else the builtin cpu default, and its answer is returned as is (None included). Wrappers of
    cross-cutting plugins still wrap it (through pluggy); without any, the implementation is called directly,
    saving pluggy's generic machinery (about 5 µs a call here) on the per-step hooks. The plugin set of a run
    does not change once it is set up."""
    caller = getattr(pm.hook, name)
    impls = caller.get_hookimpls()
    answering = [i for i in impls if not (i.wrapper or i.hookwrapper)]
    chosen = next((i for i in answering if i.plugin_name != BUILTIN_BACKEND), None) or \
        next((i for i in answering if i.plugin_name == BUILTIN_BACKEND), None)
    if chosen is None:
        return lambda **kwargs: None
    if any(i.wrapper or i.hookwrapper for i in impls):
        others = [i.plugin for i in answering if i is not chosen]
        return pm.subset_hook_caller(name, remove_plugins=others)
    function, argnames = chosen.function, tuple(chosen.argnames)
    return lambda **kwargs: function(*[kwargs[a] for a in argnames])


def declared_capabilities(pm: pluggy.PluginManager, settings: Any) -> Any:
    """The chosen backend's promises (`acc_capabilities`). A backend that declares none (a version-1 backend) is
    taken for the common case, data parallel with gradients averaged every step (what acc 0.1 assumed of all)."""
    from acc.contract.capabilities import Capabilities

    backend = settings["backend"]
    own = [i for i in pm.hook.acc_capabilities.get_hookimpls() if i.plugin_name == backend]
    if backend != BUILTIN_BACKEND and not own:
        return Capabilities(sync="every_step", distributed_type="MULTI_CPU",
                            notes=(f"backend '{backend}' declares no capabilities (hook-spec version 1): assumed "
                                   "gradients averaged every step",))
    answer = selection_caller(pm, "acc_capabilities")(settings=settings)
    if not isinstance(answer, Capabilities):
        raise PluginError(f"backend '{backend}' answered acc_capabilities with {type(answer).__name__}, not an "
                          "acc.backend.Capabilities")
    return answer


class BackendHooks:
    """The hooks of one run: `hooks.acc_wrap(...)` calls a selection hook as `selection_caller` does (one
    implementation, its answer as is); broadcast hooks are pluggy's callers. Callers are built once each."""

    def __init__(self, pm: pluggy.PluginManager):
        self._pm = pm
        self._callers: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("acc_"):
            raise AttributeError(name)
        caller = self._callers.get(name)
        if caller is None:
            if name in hookspecs.SELECTION_HOOKS or name in hookspecs.V1_COLLECTIVE_HOOKS:
                caller = selection_caller(self._pm, name)
            else:
                caller = getattr(self._pm.hook, name)
            self._callers[name] = caller
        return caller

    def call(self, name: str, **kwargs: Any) -> Any:
        return getattr(self, name)(**kwargs)


def collect_settings(pm: pluggy.PluginManager) -> SettingsRegistry:
    """The kernel's settings plus every registered plugin's, each stamped with its owner."""
    registry = SettingsRegistry()
    for setting in core_settings():
        registry.add(setting, owner=CORE_OWNER)
    for impl in reversed(pm.hook.acc_add_settings.get_hookimpls()):
        impl.function(registry=registry.scoped(impl.plugin_name))
    return registry


def implemented_hooks(plugin: Any) -> list[str]:
    """Names of the acc hooks a plugin object implements."""
    return sorted(
        name for name, fn in inspect.getmembers(plugin)
        if name.startswith("acc_") and getattr(fn, hookspecs.PROJECT + "_impl", None) is not None
    )


def plugin_requires(plugin: Any) -> tuple[str, ...]:
    """The heavy modules a plugin declares in ``ACC_REQUIRES`` (imported only when it runs)."""
    req = getattr(plugin, "ACC_REQUIRES", ())
    return (req,) if isinstance(req, str) else tuple(req)


def module_available(name: str) -> bool:
    """Whether `name` can be imported, found without importing it (a dotted name imports its parents)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


__all__ = [
    "BACKEND_GROUP", "PLUGIN_GROUP", "BUILTIN_BACKEND", "BackendHooks", "PluginInfo", "build_plugin_manager",
    "check_selection", "plugin_version", "selection_caller",
    "collect_settings", "implemented_hooks", "installed_backends", "installed_plugins", "load_backend",
    "load_plugin", "module_available", "new_plugin_manager", "plugin_requires", "register",
]
