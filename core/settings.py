"""Settings: declared by the kernel and by plugins, resolved flag > ACC_* env > cluster > project file > user file >
default (cluster: what the scheduler that started this launch knows, see `acc.cluster`).

Every setting has one declaration (`Setting`), one converter, and one place its value came from (its
source), so `acc launch --dry-run` and error messages can say where a value was set. Torch-free.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from acc.errors import ConfigError, PluginError, did_you_mean

if TYPE_CHECKING:
    from acc.config import ConfigFile

CORE_OWNER = "acc"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Setting:
    """One user-facing setting.

    `name` is the key in config files and, upper-cased with an `ACC_` prefix, the environment variable.
    `flags` are its `acc launch` options (empty: not a flag). `kind` is one of bool, int, float, str, list
    (a list of strings; comma-separated in flags and env). `choices` and `minimum`/`maximum` bound values.
    """

    name: str
    kind: type
    default: Any
    help: str
    flags: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    owner: str = CORE_OWNER
    presets: tuple[tuple[str, Any], ...] | None = None  # (semantics, default) pairs: a default per preset
    scoped: bool = False  # a plugin's own name: registered as "<plugin>.<name>" (see SettingsRegistry.add)

    @property
    def env_var(self) -> str:
        return "ACC_" + self.name.replace(".", "_").upper()

    @property
    def key(self) -> str:
        """The name in a config file (within the owner's table for a plugin's setting)."""
        return self.name.rsplit(".", 1)[-1]

    @property
    def param(self) -> str:
        """The setting's name as a Python identifier (click's parameter name)."""
        return self.name.replace(".", "__")

    def describe_valid(self) -> str:
        """What values are valid, in words."""
        if self.choices:
            return "one of: " + ", ".join(self.choices)
        if self.kind is bool:
            return "true or false"
        if self.kind is list:
            return "a list of names (comma-separated in flags and environment variables)"
        noun = {int: "an integer", float: "a number", str: "a string"}[self.kind]
        if self.minimum is not None and self.maximum is not None:
            return f"{noun} from {_num(self.minimum)} to {_num(self.maximum)}"
        if self.minimum is not None:
            return f"{noun} >= {_num(self.minimum)}"
        return noun

    def convert(self, raw: Any) -> Any:
        """Turn a raw value (a string from a flag or env var, or a TOML value) into a typed value.

        Raises ValueError with a message that says what is valid.
        """
        try:
            value = self._convert(raw)
        except (TypeError, ValueError):
            raise ValueError(f"expected {self.describe_valid()}, got {raw!r}") from None
        if self.choices and value not in self.choices:
            raise ValueError(f"expected {self.describe_valid()}, got {raw!r}{did_you_mean(str(value), self.choices)}")
        if self.kind is int and value is not None and not -(2**63) <= value < 2**64:
            raise ValueError(f"expected {self.describe_valid()} (one that fits in 64 bits), got {raw!r}")
        if self.kind is float and value is not None and not math.isfinite(value):
            raise ValueError(f"expected {self.describe_valid()} (a finite number), got {raw!r}")
        if self.kind in (int, float):
            if (self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum
            ):
                raise ValueError(f"expected {self.describe_valid()}, got {raw!r}")
        return value

    def _convert(self, raw: Any) -> Any:
        kind = self.kind
        if raw is None:
            return None
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
                return raw.strip().lower() in _TRUE
            raise ValueError
        if kind is int:
            if isinstance(raw, bool) or isinstance(raw, float):
                raise ValueError
            return int(raw.strip()) if isinstance(raw, str) else int(raw)
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if kind is list:
            if isinstance(raw, str):
                return [part.strip() for part in raw.split(",") if part.strip()]
            if isinstance(raw, (list, tuple)) and all(isinstance(x, str) for x in raw):
                return list(raw)
            raise ValueError
        if kind is str:
            if not isinstance(raw, str):
                raise ValueError
            return raw
        raise TypeError(f"unsupported setting kind {kind!r}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


class SettingsRegistry:
    """The settings a plugin set declares; names and flags are unique across plugins."""

    def __init__(self) -> None:
        self._by_name: dict[str, Setting] = {}
        self._flag_owner: dict[str, str] = {}

    def add(self, setting: Setting, owner: str | None = None) -> Setting:
        """Declare a setting; `owner` (the plugin name) defaults to the setting's own."""
        if owner is not None:
            setting = replace(setting, owner=owner)
        short = setting.name
        if not short.isidentifier() or short != short.lower() or "__" in short:
            raise PluginError(f"plugin '{setting.owner}' declares setting {short!r}: names are lower_snake_case")
        if setting.scoped and "." not in short:
            if setting.owner == CORE_OWNER:
                raise PluginError(f"setting '{short}': only a plugin's settings can be scoped")
            setting = replace(setting, name=f"{setting.owner}.{short}",
                              flags=setting.flags or (f"--{setting.owner.replace('_', '-')}-{short.replace('_', '-')}",))
        if setting.kind not in (bool, int, float, str, list):
            raise PluginError(f"plugin '{setting.owner}' declares setting '{setting.name}' of kind {setting.kind!r}; "
                              "valid kinds: bool, int, float, str, list")
        other = self._by_name.get(setting.name)
        if other is not None:
            raise PluginError(
                f"setting '{setting.name}' is declared by both '{other.owner}' and '{setting.owner}'; "
                "a setting name must be unique across the loaded plugins"
            )
        for flag in setting.flags:
            if flag in self._flag_owner:
                raise PluginError(
                    f"flag {flag} is declared by both '{self._flag_owner[flag]}' and '{setting.owner}'"
                )
        self._by_name[setting.name] = setting
        for flag in setting.flags:
            self._flag_owner[flag] = setting.owner
        return setting

    def scoped(self, owner: str) -> "ScopedRegistry":
        """A view that stamps `owner` on every setting added through it (what a plugin's hook receives)."""
        return ScopedRegistry(self, owner)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Setting:
        return self._by_name[name]

    def __iter__(self) -> Iterator[Setting]:
        return iter(self._by_name.values())

    def names(self) -> list[str]:
        return list(self._by_name)

    def owned_by(self, owner: str) -> list[Setting]:
        return [s for s in self._by_name.values() if s.owner == owner]


@dataclass
class ScopedRegistry:
    """What `acc_add_settings` receives: `add(Setting(...))` records the calling plugin as owner."""

    registry: SettingsRegistry
    owner: str

    def add(self, setting: Setting) -> Setting:
        return self.registry.add(setting, owner=self.owner)


@dataclass
class ResolvedSettings(Mapping[str, Any]):
    """Typed setting values with the source of each (`'flag --nproc'`, `'env ACC_NPROC'`, `'default'`...)."""

    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise KeyError(f"no setting named {name!r}; known: {', '.join(sorted(self.values))}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    def of(self, owner: str) -> dict[str, Any]:
        """A plugin's scoped settings by their short names (`settings.of("localsgd")["sync_every"]`)."""
        prefix = owner + "."
        return {name[len(prefix):]: value for name, value in self.values.items() if name.startswith(prefix)}

    def is_default(self, name: str) -> bool:
        """True when nobody set it: the plain default or the default of the semantics preset."""
        return self.source(name).startswith("default")

    def override(self, name: str, value: Any, source: str,
                 registry: "SettingsRegistry | None" = None) -> "ResolvedSettings":
        """A copy with one value replaced (e.g. an `Accelerator(...)` argument, source 'code'); with `registry`,
        settings that default from the changed one (the `semantics` preset) follow it."""
        values, sources = dict(self.values), dict(self.sources)
        values[name], sources[name] = value, source
        if registry is not None:
            apply_presets(registry, values, sources)
        return ResolvedSettings(values, sources)

    def to_json(self) -> str:
        return json.dumps({"values": self.values, "sources": self.sources}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ResolvedSettings":
        data = json.loads(text)
        return cls(dict(data["values"]), dict(data["sources"]))


def resolve(
    registry: SettingsRegistry,
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    files: "Sequence[ConfigFile]" = (),
    detected: Mapping[str, Any] | None = None,
    cluster: Mapping[str, tuple[Any, str]] | None = None,
) -> ResolvedSettings:
    """Resolve every registered setting: flag > ACC_* env > cluster > config files in the order given > detected >
    default.

    `flags` maps setting names to raw values that were given on the command line (absent = not given). `cluster`
    maps setting names to (value, source) from the active cluster environment (`acc.cluster.setting_values`): the
    scheduler knows this launch's allocation, which a file written beforehand does not.
    Raises ConfigError naming the flag, variable or file line of the first bad value.
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in registry:
        cfg = None
        if setting.name in flags:
            raw = flags[setting.name]
            where = f"flag {setting.flags[0]}" if setting.flags else f"argument {setting.name}"
        elif setting.env_var in environ:
            raw, where = environ[setting.env_var], f"env {setting.env_var}"
        elif cluster and setting.name in cluster:
            raw, where = cluster[setting.name]
        else:
            for cfg in files:
                found, raw = cfg.lookup(setting)
                if found:
                    where = f"{cfg.label} {cfg.path}"
                    break
            else:
                if detected and setting.name in detected:
                    values[setting.name], sources[setting.name] = detected[setting.name], "detected"
                else:
                    values[setting.name], sources[setting.name] = setting.default, "default"
                continue
        try:
            values[setting.name] = setting.convert(raw)
        except ValueError as exc:
            if cfg is not None:
                raise ConfigError(cfg.describe_key(setting, str(exc))) from None
            raise ConfigError(f"{where}: {exc} ({setting.name}: {setting.help})") from None
        sources[setting.name] = where
    apply_presets(registry, values, sources)
    return ResolvedSettings(values, sources)


SEMANTICS = ("accelerate", "acc")


def apply_presets(registry: SettingsRegistry, values: dict[str, Any], sources: dict[str, str]) -> None:
    """Give every setting that nobody set the default of the chosen `semantics` preset (source says so)."""
    preset = values.get("semantics", SEMANTICS[0])
    for setting in registry:
        if setting.presets and sources.get(setting.name, "default").startswith("default"):
            values[setting.name] = dict(setting.presets).get(preset, setting.default)
            sources[setting.name] = f"default of semantics={preset}"


def core_settings() -> list[Setting]:
    """The kernel's own settings (plugins add theirs through the `acc_add_settings` hook)."""
    return [
        Setting("backend", str, "cpu", "the backend that runs the processes (see `acc plugins`)", ("--backend",)),
        Setting("nproc", int, 1, "processes per machine", ("--nproc",), minimum=1),
        Setting(
            "plugins", list, [],
            "extra plugins to load (entry-point name or module); no:NAME blocks one", ("-p", "--plugin"),
        ),
        Setting(
            "mixed_precision", str, "no", "mixed precision mode", ("--mixed-precision",),
            choices=("no", "fp16", "bf16"),
        ),
        Setting(
            "gradient_accumulation_steps", int, 1, "micro-steps per optimizer step",
            ("--gradient-accumulation-steps",), minimum=1,
        ),
        Setting("cpu", bool, False, "run on the CPU even when an accelerator is visible", ("--cpu",)),
        # where processes meet (used by every multi-process engine)
        Setting("num_machines", int, 1, "machines in the run", ("--num-machines",), minimum=1),
        Setting("machine_rank", int, 0, "this machine's index, 0 on the main machine", ("--machine-rank",),
                minimum=0),
        Setting("main_process_ip", str, None, "address of machine 0 (multi-machine runs)", ("--main-process-ip",)),
        Setting("main_process_port", int, None, "port on machine 0; default: a free port on one machine, "
                "29500 across machines", ("--main-process-port",), minimum=1, maximum=65535),
        Setting("rdzv_backend", str, "c10d", "rendezvous backend of torch's elastic agent", ("--rdzv-backend",),
                choices=("c10d", "static", "etcd", "etcd-v2")),
        Setting("max_restarts", int, 0, "times the workers are restarted after a failure", ("--max-restarts",),
                minimum=0),
        Setting("start_method", str, "auto", "how local workers start: fork (from a launcher that imported torch "
                "once: faster), spawn (fresh interpreters), auto (fork where safe)", ("--start-method",),
                choices=("auto", "fork", "spawn")),
        Setting("worker_memory", str, "keep", "what workers' allocator does with freed tensors: keep (glibc's default: "
                "kept for reuse, RSS stays at its high-water mark), release (returned at once, fresh memory in 2 MiB "
                "pages: RSS follows live memory; see acc/launch/worker_memory.py)", ("--worker-memory",),
                choices=("keep", "release")),
        Setting("tee", bool, False, "show every process's output on the console, prefixed [rank N] (default: "
                "the main process's only)", ("--tee",)),
        Setting("log_dir", str, None, "keep each process's output in DIR/<run>/attempt_<n>/<local rank>/ "
                "(default: the run directory's logs/)", ("--log-dir",)),
        Setting("output_dir", str, "acc_runs", "where each launch records its manifest (run configuration, "
                "versions, command); '' records nothing", ("--output-dir",)),
        Setting("timeout", float, 1800.0, "seconds a collective may wait before the run fails", ("--timeout",),
                minimum=1),
        Setting("dynamo_backend", str, "no", "compile prepared models with torch.compile and this backend (e.g. "
                "inductor, aot_eager); no: eager", ("--dynamo-backend",)),
        *loop_semantics_settings(),
        Setting("monitor_interval", float, 0.1, "seconds between the elastic agent's checks of its workers' state "
                "(torchrun's and Accelerate's --monitor_interval)", ("--monitor-interval",), minimum=0.01),
        Setting("log_with", list, [], "experiment trackers init_trackers starts: names from `acc plugins` (jsonl is "
                "built in), or all for every installed one; Accelerator(log_with=...) overrides it", ("--log-with",)),
        Setting("rdzv_timeout", float, 900.0, "seconds the launchers of a multi-machine run wait for every machine to "
                "join; then the launch fails naming the machines that joined and those missing",
                ("--rdzv-timeout",), minimum=1, maximum=10**7),
        Setting("listen_address", str, None, "the address the rendezvous store listens on (default: 127.0.0.1 on one "
                "machine; across machines, machine 0's address that reaches --main-process-ip); 0.0.0.0, :: or * "
                "listen on every interface", ("--listen-address",)),
    ]


def _preset(accelerate: Any, acc: Any) -> tuple[tuple[str, Any], ...]:
    return (("accelerate", accelerate), ("acc", acc))


def loop_semantics_settings() -> list[Setting]:
    """Where acc's own training-loop semantics differ from Accelerate's: one setting each, plus the preset.

    `semantics = "accelerate"` (the default) makes a script written for Accelerate train identically;
    `semantics = "acc"` selects acc's own behaviour for all of them at once. Each can be set on its own.
    """
    return [
        Setting("semantics", str, "accelerate", "training-loop semantics: accelerate (a script written for Hugging "
                "Face Accelerate trains identically) or acc (exact resume, seeded shuffling, one scheduler step per "
                "optimizer step, short last batch, no clipping on accumulation micro-steps); the settings below "
                "default from it", ("--semantics",), choices=SEMANTICS),
        Setting("use_seedable_sampler", bool, False, "shuffle epoch e with data_seed + e (the same order on any number "
                "of processes, nothing exchanged) instead of rank 0's generator state sent to every rank",
                ("--use-seedable-sampler",), presets=_preset(False, True)),
        Setting("data_seed", int, None, "seed of the seedable sampler (default: torch's initial seed, what set_seed "
                "set)", ("--data-seed",)),
        Setting("resume_data_position", bool, False, "load_state also continues each data loader where the checkpoint "
                "stopped (its epoch, batch and shuffling state); without it a script skips batches itself, as with "
                "Accelerate", ("--resume-data-position",), presets=_preset(False, True)),
        Setting("scheduler_stepping", str, "per_process", "a prepared LR scheduler steps num_processes times per "
                "optimizer step (per_process, Accelerate's; once with split_batches), once per applied optimizer step "
                "(once), or at every call (every_call: Accelerator(step_scheduler_with_optimizer=False))",
                ("--scheduler-stepping",), choices=("per_process", "once", "every_call"),
                presets=_preset("per_process", "once")),
        Setting("last_batch", str, "fill", "with even_batches, the last batch of every process is filled to full size "
                "with samples from the start of the epoch (fill, Accelerate's) or the data's short last batch stays "
                "short and only processes without a batch get one (short)", ("--last-batch",),
                choices=("fill", "short"), presets=_preset("fill", "short")),
        Setting("clip_on_micro_steps", bool, True, "clip_grad_norm_/clip_grad_value_ also clip the partial gradients "
                "of accumulation micro-steps (Accelerate's); false: they do nothing there and clip_grad_norm_ returns "
                "None", ("--clip-on-micro-steps",), presets=_preset(True, False)),
        Setting("fp16_on_cpu", bool, False, "mixed_precision fp16 on the CPU runs float16 autocast with a gradient "
                "scaler; false: float32, as Accelerate trains there", ("--fp16-on-cpu",), presets=_preset(False, True)),
    ]
