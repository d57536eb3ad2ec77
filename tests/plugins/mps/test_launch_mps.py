"""The mps backend in the launcher: plan, refusals (more than one process, no MPS here), the fallback
setting, what `acc env` reports, and that none of it imports torch."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from acc.errors import ValidationError
from acc.launcher import orchestrate
from acc_mps import availability
from tests.conftest import ACC, clean_env, run
from tests.plugins.mps.conftest import mps_assembly, requires_no_mps

FALLBACK = "PYTORCH_ENABLE_MPS_FALLBACK"


def problems_of(assembly) -> list[str]:
    with pytest.raises(ValidationError) as info:
        orchestrate.make_plan(assembly)
    return info.value.problems


# ------------------------------------------------------------------------------------- with MPS faked available


def test_plan_is_one_plain_process_on_the_mps_device(mps_pm, fake_mps):
    plan = orchestrate.make_plan(mps_assembly(mps_pm))
    assert (plan.engine, plan.world_size, plan.rendezvous) == ("process", 1, None)
    assert plan.device == "mps (the Apple Silicon GPU)"
    assert plan.env == {} and plan.notes == []


def test_more_than_one_process_is_refused_at_plan_time(mps_pm, fake_mps):
    problems = problems_of(mps_assembly(mps_pm, nproc="2"))
    assert problems == [
        "backend 'mps' runs one process (a Mac has one GPU, and torch.distributed has no MPS transport), but "
        "nproc = 2 (from flag --nproc); drop --nproc (or set it to 1)"
    ]


def test_more_than_one_machine_is_refused_at_plan_time(mps_pm, fake_mps):
    problems = problems_of(mps_assembly(mps_pm, num_machines="2", main_process_ip="10.0.0.1"))
    assert problems == [
        "backend 'mps' runs on one machine, but num_machines = 2 (from flag --num-machines); drop "
        "--num-machines: training across Macs is not supported"
    ]


def test_bf16_is_refused_at_plan_time_before_macos_14(mps_pm, fake_mps):
    fake_mps(macos=(13, 6))  # torch 2.9 still offers MPS there, but not bfloat16
    problems = problems_of(mps_assembly(mps_pm, mixed_precision="bf16"))
    assert problems == [
        "mixed_precision 'bf16' (from flag --mixed-precision) on MPS needs macOS 14.0 or newer, but this Mac "
        "runs macOS 13.6; use --mixed-precision fp16 or no, or update macOS"
    ]
    assert orchestrate.make_plan(mps_assembly(mps_pm, mixed_precision="fp16")).engine == "process"


@pytest.mark.parametrize("source", ["flag", "env", "config"])
def test_fallback_setting_puts_the_variable_into_the_worker_environment(mps_pm, fake_mps, monkeypatch, tmp_path,
                                                                         source):
    flags = {}
    if source == "flag":
        flags["mps_fallback"] = "true"
    elif source == "env":
        monkeypatch.setenv("ACC_MPS_FALLBACK", "1")
    else:
        (tmp_path / "acc.toml").write_text('backend = "mps"\n\n[mps]\nmps_fallback = true\n')
    assembly = mps_assembly(mps_pm, **flags)
    plan = orchestrate.make_plan(assembly)
    assert plan.env == {FALLBACK: "1"}
    assert plan.notes == [f"{FALLBACK}=1: operators MPS lacks run on the CPU (torch warns when it falls back)"]
    assert orchestrate.worker_environment(assembly, plan, base={"PATH": "/bin"})[FALLBACK] == "1"


def test_fallback_explicitly_off_overrides_an_inherited_variable(mps_pm, fake_mps, monkeypatch):
    monkeypatch.setenv(FALLBACK, "1")
    inherited = mps_assembly(mps_pm)
    plan = orchestrate.make_plan(inherited)
    assert plan.env == {} and orchestrate.worker_environment(inherited, plan)[FALLBACK] == "1"  # default: left alone
    off = mps_assembly(mps_pm, mps_fallback="false")
    plan = orchestrate.make_plan(off)
    assert plan.env == {FALLBACK: "0"} and orchestrate.worker_environment(off, plan)[FALLBACK] == "0"


# ------------------------------------------------------------------------------------- the launcher's decision


@pytest.mark.parametrize("system,machine,mac,fragment", [
    ("Linux", "x86_64", "", "this machine runs Linux (x86_64); MPS exists only on macOS on Apple Silicon (arm64)"),
    ("Windows", "AMD64", "", "this machine runs Windows (AMD64)"),
    ("Darwin", "x86_64", "14.5", "an Intel Mac, or an x86_64 Python running under Rosetta 2"),
    ("Darwin", "arm64", "13.6", "this Mac runs macOS 13.6, and torch 2.13.0 offers MPS from macOS 14.0 on"),
])
def test_launcher_side_status_says_why_from_platform_facts(monkeypatch, system, machine, mac, fragment):
    monkeypatch.setattr(platform, "system", lambda: system)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(platform, "mac_ver", lambda: (mac, ("", "", ""), machine))
    monkeypatch.setattr(availability, "installed_torch", lambda: "2.13.0")
    status = availability.mps_status(with_torch=False)
    assert not status.available and fragment in status.reason
    assert status.facts["platform"] == f"{system} {machine}" and status.facts["macOS"] == (mac or "-")


def test_launcher_side_status_accepts_a_supported_mac(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    monkeypatch.setattr(platform, "mac_ver", lambda: ("14.5", ("", "", ""), "arm64"))
    status = availability.mps_status(with_torch=False)
    assert (status.available, status.reason, status.macos) == (True, "", (14, 5))


@pytest.mark.parametrize("version,needed", [("2.9.1", (13, 0)), ("2.10.0", (14, 0)), ("2.13.0+cpu", (14, 0)),
                                            (None, (14, 0))])
def test_minimum_macos_follows_the_torch_release(version, needed):
    assert availability.minimum_macos(version) == needed


# ------------------------------------------------------------------------------------- real processes, this machine


def modules_after(argv: list[str]) -> tuple[int, list[str]]:
    """Run `acc ARGV` in-process in a fresh interpreter; (exit code, which of torch / acc_mps.plugin loaded)."""
    code = (
        "import sys\nfrom acc.cli import main\ncode = 0\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as exc:\n    code = exc.code or 0\n"
        "print('LOADED', code, sorted(m for m in ('torch', 'acc_mps.plugin') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("LOADED")]
    assert line, proc.stdout + proc.stderr
    _, code_text, loaded = line[0].split(" ", 2)
    return int(code_text), eval(loaded)


@requires_no_mps
def test_launch_without_mps_fails_before_starting_anything(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("open('started', 'w').write('yes')\n")
    proc = run([ACC, "launch", "--backend", "mps", str(script)], tmp_path)
    assert proc.returncode == 2
    assert "backend 'mps' (from flag --backend) needs the GPU of an Apple Silicon Mac, which is not available: " \
           in proc.stderr
    assert f"this machine runs {platform.system()}" in proc.stderr or "this Mac" in proc.stderr
    assert "use --backend cpu instead" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "started").exists() and not (tmp_path / "acc_runs").exists()


@requires_no_mps
def test_launcher_refusal_does_not_import_torch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    code, loaded = modules_after(["launch", "--backend", "mps", "--nproc", "2", "--dry-run", str(script)])
    assert code == 2 and loaded == ["acc_mps.plugin"]


def test_dry_run_does_not_import_torch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    code, loaded = modules_after(["launch", "--backend", "mps", "--cpu", "--mps-fallback", "--dry-run", str(script)])
    assert code == 0 and loaded == ["acc_mps.plugin"]


def test_dry_run_shows_the_plan_and_the_fallback_variable(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    proc = run([ACC, "launch", "--backend", "mps", "--cpu", "--mps-fallback", "--dry-run", str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "engine     process: one plain Python process" in proc.stdout
    assert "device     cpu (--cpu: the MPS device is not used)" in proc.stdout
    assert "mps_fallback                 True          flag --mps-fallback" in proc.stdout
    assert f"worker environment additions: {FALLBACK}=1" in proc.stdout


@requires_no_mps
def test_plain_python_run_without_mps_fails_with_the_reason(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from acc import Accelerator\nAccelerator()\nprint('trained')\n")
    proc = run([sys.executable, str(script)], tmp_path, env=clean_env(tmp_path, ACC_BACKEND="mps"))
    assert proc.returncode != 0 and "trained" not in proc.stdout
    assert "backend 'mps' cannot run: the MPS device is not available: " in proc.stderr
    assert "torch.backends.mps.is_built() = False, is_available() = False" in proc.stderr
    assert "use --backend cpu instead" in proc.stderr


def test_acc_env_reports_mps_and_the_facts_that_decide_it(tmp_path):
    import torch

    proc = run([ACC, "env"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout[proc.stdout.index("mps (acc-mps 0.1.0)"):]
    available = torch.backends.mps.is_available()
    assert f"MPS available          {'yes' if available else 'no: '}" in section
    assert f"platform               {platform.system()} {platform.machine()}" in section
    assert f"torch                  {torch.__version__}" in section
    assert "macOS " in section and "MPS needs              Apple Silicon (arm64), macOS " in section
    assert f"mps.is_built()         {torch.backends.mps.is_built()}" in section
    assert f"mps.is_available()     {available}" in section
    assert f"{FALLBACK} (unset)" in section
