"""The kernel's own settings, and how every setting gets its value: flag > ACC_* env > cluster > project file >
user file > detected > default, then the `semantics` preset for what nobody set.

Plugins declare their settings through `acc_add_settings`; the declarations themselves (`Setting`, the registry,
the resolved values with their sources) are `acc.contract.settings`. Torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from acc.contract.settings import SEMANTICS, ResolvedSettings, Setting, SettingsRegistry, apply_presets
from acc.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from acc.assembly.config_files import ConfigFile


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
    maps setting names to (value, source) from the active cluster environment (`acc.assembly.clusters.setting_values`): the
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
            refused=(("fp8", "acc has no fp8 mixed precision yet (Accelerate's needs torchao, Transformer Engine or "
                              "MS-AMP and a GPU with fp8 support: Hopper such as H100/H200, or Ada); use bf16, which "
                              "those GPUs run natively"),),
        ),
        Setting(
            "gradient_accumulation_steps", int, 1, "micro-steps per optimizer step",
            ("--gradient-accumulation-steps",), minimum=1,
        ),
        Setting("cpu", bool, False, "run on the CPU even when an accelerator is visible", ("--cpu",)),
        # where processes meet (used by every multi-process engine)
        Setting("num_machines", int, 1, "machines in the run", ("--num-machines",), minimum=1),
        *(Setting(f"mesh_{dim}_size", int, None,
                  f"ParallelismConfig {dim}_size for Accelerator() (the sizes' product is the process count)",
                  (f"--parallelism-config-{dim.replace('_', '-')}-size",), minimum=1)
          for dim in ("dp_replicate", "dp_shard", "tp", "cp", "sp")),
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
                "kept for reuse, RSS stays at its high-water mark), release (returned at once: RSS follows live "
                "memory; see acc/launcher/worker_memory.py)", ("--worker-memory",),
                choices=("keep", "release")),
        Setting("huge_pages", str, "auto", "whether workers' malloc asks for transparent huge pages: auto (where the "
                "kernel offers them: fresh memory 2 MiB at a time, far fewer page faults; on the sharded bench model "
                "steps 16-20% faster, fsdp's kept peak RSS 12% higher) or off (4 KiB pages)", ("--huge-pages",),
                choices=("auto", "off")),
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
                "optimizer step, short last batch, no clipping on accumulation micro-steps, an uninstalled tracker an "
                "error); the settings below default from it", ("--semantics",), choices=SEMANTICS),
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
        Setting("compile_random", str, "inductor", "where a model compiled with inductor draws its random numbers "
                "(dropout's masks): inductor (its own generator, Accelerate's; on the CPU one Philox draw per element) "
                "or eager (torch's generator: the uncompiled model's masks exactly; on the CPU a transformer block's step "
                "was 1.05x eager's against inductor's 1.45x in a plain script, 0.98x inductor's under acc launch)",
                ("--compile-random",), choices=("inductor", "eager"), presets=_preset("inductor", "eager")),
        Setting("missing_tracker", str, "skip", "a tracker log_with names (one Accelerate knows: wandb, "
                "tensorboard, ...) whose package is not installed: skip (left out, said once at init_trackers; "
                "Accelerate's) or error (a TrackerError when the Accelerator is made)", ("--missing-tracker",),
                choices=("skip", "error"), presets=_preset("skip", "error")),
        Setting("fp16_on_cpu", bool, False, "mixed_precision fp16 on the CPU runs float16 autocast with a gradient "
                "scaler; false: float32, as Accelerate trains there", ("--fp16-on-cpu",), presets=_preset(False, True)),
    ]
