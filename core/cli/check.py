"""`acc check`: run a small built-in training job on the chosen backend and print a table of checks."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click

from acc.cli.launch import LaunchCommand, resolved_assembly
from acc.contract.launch_plan import Target

DEVICE_TYPES = ("cpu", "cuda", "mps", "xla", "xpu", "hpu", "npu")


@click.command(
    "check", cls=LaunchCommand,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Verify a backend before a real run: start a small training job with the same settings a launch "
         "would use, and check ranks, devices, batch sizes, training against what the backend declares "
         "(every-step sync: loss equal to a single-process reference and identical gradients; periodic sync: "
         "replicas equal at each synchronisation and apart between them), metric gathering, a save/load "
         "round-trip and the data position after load_state. Exits 1 if any check fails.",
)
@click.option("--config-file", type=str, default=None, help="A TOML config file used instead of ./acc.toml.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
def check(ctx: click.Context, config_file: str | None, as_json: bool, **setting_values: Any) -> None:
    from acc.launcher import orchestrate

    assembly = resolved_assembly(ctx, setting_values, config_file)
    plan = orchestrate.make_plan(assembly)
    kind = plan.device.split()[0].split(":")[0]
    out = Path(tempfile.mkdtemp(prefix="acc-check-")) / "results.json"
    args = ["--out", str(out), "--expected-world", str(plan.world_size)]
    if kind in DEVICE_TYPES:
        args += ["--expected-device", kind]
    env = orchestrate.worker_environment(assembly, plan)
    env.update(orchestrate.logging_environment(assembly, None))
    env.pop("ACC_RUN_DIR", None)
    code = orchestrate.execute(plan, Target("acc.testing.check_job", tuple(args), is_module=True), env, replace=False)
    data = json.loads(out.read_text()) if out.is_file() else {"planned": [], "results": []}
    results, planned = data["results"], data["planned"]
    precision = data.get("precision")
    done = {r["check"] for r in results}
    missing = [name for name in planned if name not in done]
    if as_json:
        out_data = {"exit_code": code, "checks": results, "not_run": missing}
        if precision is not None:
            out_data["precision"] = precision
        click.echo(json.dumps(out_data, indent=2))
    else:
        s = assembly.settings
        click.echo(f"acc check: backend {s['backend']}, {plan.world_size} process(es), mixed precision "
                   f"{s['mixed_precision']}, semantics {s['semantics']} (resume_data_position "
                   f"{str(s['resume_data_position']).lower()}, scheduler_stepping {s['scheduler_stepping']})")
        width = max([len(name) for name in planned] + [5])
        for r in results:
            click.echo(f"  {'PASS' if r['ok'] else 'FAIL'}  {r['check'].ljust(width)}  {r['measured']}"
                       + ("" if r["ok"] else f"   (expected {r['expected']})"))
        for name in missing:
            click.echo(f"  ----  {name.ljust(width)}  not run")
        if not planned:
            click.echo(f"  FAIL  the check job did not start (exit code {code}); see the report above")
        if precision is not None:
            for line in precision_lines(precision):
                click.echo(line)
    precision_failed = precision is not None and ("error" in precision or precision.get("finite") is False)
    failed = (code != 0 or not planned or bool(missing) or not all(r["ok"] for r in results)
              or precision_failed)
    if out.is_file():
        os.unlink(out)
    ctx.exit(1 if failed else 0)


SLOW_RATIO = 1.5  # above this, the report says what to do


def precision_lines(p: dict) -> list[str]:
    """The report of the mixed-precision comparison the check job measured (see acc.testing.check_job.compare_precision)."""
    mode = p["mode"]
    support = {True: "native", False: "EMULATED", None: "unknown"}[p.get("native")]
    if "skipped" in p:
        return [f"mixed precision {mode} against fp32 on {p['device']}: not measured: {p['skipped']}"]
    lines = [f"mixed precision {mode} against fp32 on {p['device']}: {support} ({p['support']})"]
    if "error" in p:
        return lines + [f"  FAIL  a {mode} training step failed: {p['error']}"]
    lines.append(f"  {p['model']}; median of {p['rounds']} alternating repeats of {p['steps_per_round']} steps")
    ratio = p["ratio"]
    lines.append(f"  step time ratio {mode}/fp32  {ratio:.2f}  ({mode} {p['mixed_s_per_step'] * 1e3:.3g} ms/step, "
                 f"fp32 {p['fp32_s_per_step'] * 1e3:.3g} ms/step)")
    state = "" if p.get("finite", True) else "  FAIL: not finite"
    lines.append(f"  loss difference {mode}-fp32  max relative {p['loss_max_rel_diff']:.2e}, max absolute "
                 f"{p['loss_max_abs_diff']:.2e} over {p['loss_steps']} steps (final loss {mode} "
                 f"{p['losses_mixed'][-1]:.5f}, fp32 {p['losses_fp32'][-1]:.5f}){state}")
    if p.get("note"):
        lines.append(f"  note: {p['note']}")
    if ratio > SLOW_RATIO:
        lines.append(f"  {mode} is {ratio:.1f}x slower than fp32 here: train with mixed_precision 'no' on this device"
                     + (" (the device emulates it)" if p.get("native") is False else ""))
    return lines
