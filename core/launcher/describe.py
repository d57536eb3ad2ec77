"""What `acc launch --dry-run` (and `acc.launch(fn, dry_run=True)`) prints: the plan, the plugins with their
versions, the backend's promises, where the processes meet, and every setting with where it came from (a
credential-like value is never shown: `acc.assembly.redact`). Torch-free.
"""

from __future__ import annotations

from acc.assembly.choose import Assembly
from acc.assembly.redact import redact_value
from acc.contract.launch_plan import ENGINES, LaunchPlan, Target


def settings_lines(assembly: Assembly) -> list[str]:
    """Every setting with its value and where it came from, and the config files read."""

    s = assembly.settings
    lines = ["settings (value, then where it came from):"]
    name_width = max(len(n) for n in s)
    for name in s:
        value = redact_value(name, s[name])  # a credential-like setting's value is not shown (acc.assembly.redact)
        shown = ",".join(value) if isinstance(value, list) else ("" if value is None else str(value))
        lines.append(f"  {name.ljust(name_width)}  {(shown or '-').ljust(12)}  {s.source(name)}")
    if assembly.files:
        lines.append("config files read: " + ", ".join(f"{f.path} ({f.label})" for f in assembly.files))
    return lines


def _mesh_rows(settings: object) -> list[tuple[str, str]]:
    """The ParallelismConfig the --parallelism-config-*-size flags give, drawn (none given: no rows)."""
    from acc.runtime.parallelism import mesh_lines, sizes_from_settings

    sizes = sizes_from_settings(settings)
    if sizes is None:
        return []
    lines = mesh_lines(sizes)
    return [("mesh", lines[0]), *(("", line) for line in lines[1:])]


def describe(assembly: Assembly, plan: LaunchPlan, target: Target) -> str:
    """The dry-run report: plan, plugins with versions, the backend's promises, every setting with its source."""
    from acc.assembly.redact import redact_shell
    from acc.launcher import preflight
    from acc.launcher.orchestrate import capabilities as orchestrate_capabilities
    from acc.tracking import describe_setting

    s = assembly.settings
    lines = ["acc launch plan (dry run: nothing was started)"]
    if assembly.detection_line:
        lines.append(f"detected: {assembly.detection_line}")
    backend = s["backend"]
    info = assembly.infos.get(backend)
    plugin_rows = [
        f"{name} ({i.distribution} {i.version}{', default' if name == 'cpu' and backend != 'cpu' else ''})"
        for name, i in assembly.infos.items()
    ]
    rows = [
        ("backend", f"{backend} ({info.distribution} {info.version})" if info else backend),
        ("plugins", ", ".join(plugin_rows)),
        ("engine", f"{plan.engine}: {ENGINES[plan.engine]}"),
        ("processes", f"{plan.nproc_per_machine} per machine x {plan.num_machines} machine(s) = {plan.world_size}"
                      + (f", this is machine {plan.machine_rank}" if plan.num_machines > 1 else "")),
        ("device", plan.device),
        ("precision", s["mixed_precision"]),
        ("promises", orchestrate_capabilities(assembly).describe()),
        *_mesh_rows(s),
        ("semantics", f"{s['semantics']} ({s.source('semantics')}): scheduler_stepping {s['scheduler_stepping']}, "
                      f"resume_data_position {str(s['resume_data_position']).lower()}, seedable sampler "
                      f"{str(s['use_seedable_sampler']).lower()}, last_batch {s['last_batch']}"),
        *((("trackers", describe_setting(s["log_with"])),) if "log_with" in s else ()),
        ("command", redact_shell(target.command())),
    ]
    if plan.rendezvous is not None:
        rdzv = plan.rendezvous
        rows.append(("rendezvous", f"{rdzv.backend} at {rdzv.endpoint or 'a free local port (picked at start)'}"
                     + (f" ({rdzv.why})" if rdzv.why else "")))
        if plan.engine in ("elastic", "task"):
            from acc.launcher import listen

            rows.append(("listening", listen.describe(plan)))
        if plan.engine == "task":
            rows.append(("rank 0", f"the main process: the task with RANK 0 ({assembly.cluster.name} started it); "
                                   f"this process is rank {plan.env.get('RANK')}"))
        elif plan.num_machines > 1:
            rows.append(("rank 0", "the main process: " + rdzv.main_machine(plan.nproc_per_machine)))
            rows.append(("joining", f"every machine joins within {rdzv.timeout:g} s (--rdzv-timeout) or the launch "
                                    "fails naming the missing ones; a machine lost later stops the others within "
                                    "15 s"))
        if preflight.needed(plan):
            rows.append(("checks", preflight.planned(plan, s, assembly.cluster)))
    if assembly.cluster is not None:
        rows.append(("cluster", assembly.cluster.describe()))
    if plan.max_restarts:
        rows.append(("restarts", str(plan.max_restarts)))
    if plan.engine == "elastic":
        method = s["start_method"]
        rows.append(("start", "spawn (fresh interpreters)" if method == "spawn" else
                     "fork from a launcher that imports torch once" + (" (auto: falls back to spawn, saying why, if "
                     "CUDA or threads were started in the launcher)" if method == "auto" else "")))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines += settings_lines(assembly)
    from acc.launcher.orchestrate import environment_additions

    extra = environment_additions(plan)
    if extra:
        lines.append("worker environment additions: " + ", ".join(f"{k}={v}" for k, v in sorted(extra.items())))
    for note in plan.notes + list(assembly.cluster.notes if assembly.cluster else ()):
        lines.append(f"note: {note}")
    return "\n".join(lines)
