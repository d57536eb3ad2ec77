"""The xla backend's launcher side, torch-free: device choice, settings checks, the plan, and the PJRT
executor (with a stand-in torch_xla, so it runs in both lanes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import acc.builtin.cpu
from acc.assembly.choose import assemble
from acc.assembly.plugins import new_plugin_manager, register
from acc.contract.launch_plan import LaunchPlan, Target
from acc.errors import ValidationError
from acc.launcher import orchestrate, pjrt
from acc_xla import loader, plugin
from tests.conftest import clean_env

PLAIN_ENV = {"PJRT_DEVICE", "CPU_NUM_DEVICES", "TPU_LIBRARY_PATH"}
REAL_TPU_CHIPS = plugin.tpu_chips


@pytest.fixture(autouse=True)
def no_device_env(monkeypatch):
    """No TPU, no PJRT variables, and torch_xla counted as installed (its absence is tested elsewhere)."""
    for key in PLAIN_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(plugin, "tpu_chips", lambda root=plugin.PCI_DEVICES: 0)
    monkeypatch.setattr(plugin.sdk, "module_available", lambda name: name == "torch_xla")


def make_plan(**flags) -> LaunchPlan:
    pm = new_plugin_manager()
    register(pm, acc.builtin.cpu, "cpu")
    register(pm, plugin, "xla")
    return orchestrate.make_plan(assemble(flags={"backend": "xla", **flags}, environ={}, pm=pm))


def problems(**flags) -> list[str]:
    with pytest.raises(ValidationError) as info:
        make_plan(**flags)
    return info.value.problems


def on_tpu(monkeypatch, chips: int = 4) -> None:
    monkeypatch.setattr(plugin, "tpu_chips", lambda root=plugin.PCI_DEVICES: chips)
    monkeypatch.setattr(plugin, "libtpu_available", lambda environ: True)


def test_tpu_chips_are_counted_from_the_pci_bus(tmp_path):
    for name, vendor, device in [("0000:00:04.0", "0x1ae0", "0x005e"), ("0000:00:05.0", "0x1ae0", "0x005e"),
                                 ("0000:00:06.0", "0x1ae0", "0x1234"), ("0000:00:07.0", "0x8086", "0x005e")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "vendor").write_text(vendor + "\n")
        (tmp_path / name / "device").write_text(device + "\n")
    assert REAL_TPU_CHIPS(tmp_path) == 2 and REAL_TPU_CHIPS(tmp_path / "missing") == 0


def test_cpu_plan_without_a_tpu(tmp_path):
    plan = make_plan()
    assert plan.engine == "pjrt" and plan.nproc_per_machine == 1 and plan.num_machines == 1
    assert plan.env == {"PJRT_DEVICE": "CPU"}
    assert "XLA CPU device" in plan.device and "auto: no TPU attached" in plan.device
    assert not plan.problems()


def test_pjrt_device_from_the_environment_and_from_cpu_flag(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "cpu")
    assert make_plan().env == {"PJRT_DEVICE": "CPU"}
    on_tpu(monkeypatch)
    monkeypatch.delenv("PJRT_DEVICE")
    assert make_plan(cpu=True).env == {"PJRT_DEVICE": "CPU"}
    assert "--cpu" in make_plan(cpu=True).device


def test_tpu_plan_is_one_process_per_chip_or_one(monkeypatch):
    on_tpu(monkeypatch, chips=4)
    plan = make_plan()
    assert plan.env == {"PJRT_DEVICE": "TPU"} and plan.nproc_per_machine == 4
    assert "4 TPU device process(es)" in plan.device
    assert make_plan(nproc=4).nproc_per_machine == 4
    assert make_plan(nproc=1).nproc_per_machine == 1  # PJRT's single-process mode


def test_tpu_attached_but_no_libtpu_means_cpu(monkeypatch):
    monkeypatch.setattr(plugin, "tpu_chips", lambda root=plugin.PCI_DEVICES: 4)
    monkeypatch.setattr(plugin, "libtpu_available", lambda environ: False)
    plan = make_plan()
    assert plan.env == {"PJRT_DEVICE": "CPU"} and "libtpu is not installed" in plan.device


def test_settings_the_backend_cannot_run_are_reported_together(monkeypatch):
    on_tpu(monkeypatch, chips=4)
    found = "\n".join(problems(nproc=3, mixed_precision="fp16", num_machines=2, main_process_ip="10.0.0.1",
                                max_restarts=2))
    assert "mixed_precision 'fp16' is not supported by the xla backend" in found
    assert "use --mixed-precision bf16" in found
    assert "nproc = 3 (from flag --nproc)" in found and "4 on PJRT_DEVICE=TPU" in found and "or 4 (every local" in found
    assert "PJRT finds the hosts of a TPU slice itself" in found
    assert "max_restarts = 2 (from flag --max-restarts)" in found and "does not restart workers" in found


def test_several_xla_cpu_devices_are_refused(monkeypatch):
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    assert any("CPU_NUM_DEVICES=2" in p and "collective rendezvous" in p for p in problems())


def test_tpu_requested_without_a_chip(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert any("no TPU chip is attached" in p for p in problems())


def test_other_backends_are_not_checked():
    pm = new_plugin_manager()
    register(pm, acc.builtin.cpu, "cpu")
    register(pm, plugin, "xla")
    settings = assemble(flags={"backend": "cpu", "mixed_precision": "fp16"}, environ={}, pm=pm).settings
    assert plugin.acc_validate(settings) == []


def test_step_seed_depends_on_seed_epoch_and_batch_only():
    seeds = {loader.step_seed(s, e, i) for s in (0, 1) for e in (0, 1) for i in range(50)}
    assert len(seeds) == 200 and all(0 <= x < 2**64 for x in seeds)
    assert loader.step_seed(3, 1, 7) == loader.step_seed(3, 1, 7)


# ----------------------------------------------------------------------------- the pjrt executor


STUB = '''
import json, os
def spawn(fn, args=(), nprocs=None, join=True, daemon=False, start_method="spawn"):
    with open(os.environ["STUB_LOG"], "a") as fp:
        fp.write(json.dumps({"nprocs": nprocs}) + "\\n")
    fn(0, *args)
'''


@pytest.fixture
def stub_xla(tmp_path) -> dict[str, str]:
    """A stand-in torch_xla whose xmp.spawn records nprocs and runs the worker in this process."""
    pkg = tmp_path / "stub" / "torch_xla" / "distributed"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "xla_multiprocessing.py").write_text(STUB)
    return clean_env(tmp_path, PYTHONPATH=str(tmp_path / "stub"), STUB_LOG=str(tmp_path / "spawn.log"),
                     FROM_LAUNCHER="yes")


SCRIPT = '''
import json, os, sys
json.dump({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "env": os.environ.get("FROM_LAUNCHER")},
          open(os.environ["OUT"], "w"))
if sys.argv[1:2] == ["fail"]:
    raise ValueError("worker failed here")
sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
'''


def test_driver_arguments_round_trip():
    for target in (Target("train.py", ("--lr", "0.1", "-m", "x")), Target("pkg.mod", ("a",), is_module=True)):
        argv = pjrt.driver_argv(LaunchPlan(engine="pjrt", nproc_per_machine=4), target, "py")
        assert argv[:4] == ["py", "-m", "acc.launcher.pjrt", "4"]
        assert pjrt.parse_driver_args(argv[3:]) == (4, target)
    with pytest.raises(SystemExit):
        pjrt.parse_driver_args(["x"])


@pytest.mark.parametrize("nproc,expected", [(1, 1), (4, None)])
def test_executor_runs_the_script_as_main_with_its_argv_and_environment(tmp_path, stub_xla, nproc, expected):
    script = tmp_path / "sub" / "job.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    env = {**stub_xla, "OUT": str(tmp_path / "seen.json")}
    code = pjrt.execute(LaunchPlan(engine="pjrt", nproc_per_machine=nproc), Target(str(script), ("7", "--x")),
                        env, replace=False)
    assert code == 7  # the script's own exit code
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"argv": [str(script), "7", "--x"], "path0": str(script.parent), "name": "__main__",
                    "env": "yes"}
    # xmp.spawn takes 1 (one process) or None (every local device)
    assert json.loads((tmp_path / "spawn.log").read_text()) == {"nprocs": expected}


def test_executor_reports_a_failing_script_like_python_does(tmp_path, stub_xla):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "acc.launcher.pjrt", "1", str(script), "fail"], cwd=tmp_path,
                          env={**stub_xla, "OUT": str(tmp_path / "o.json")}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Traceback (most recent call last):\n  File \"" + str(script))
    assert "ValueError: worker failed here" in proc.stderr and "xla_multiprocessing" not in proc.stderr


def test_executor_runs_a_module(tmp_path, stub_xla):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "__main__.py").write_text(SCRIPT)
    code = pjrt.execute(LaunchPlan(engine="pjrt"), Target("mypkg", ("0",), is_module=True),
                        {**stub_xla, "OUT": str(tmp_path / "m.json")}, replace=False)
    seen = json.loads((tmp_path / "m.json").read_text())
    assert code == 0 and seen["name"] == "__main__" and seen["argv"][1:] == ["0"]
    assert Path(seen["argv"][0]).name == "__main__.py"


def test_launch_executes_through_the_kernel_executor_table():
    assert orchestrate.EXECUTORS["pjrt"] == "acc.launcher.pjrt"


def test_two_processes_on_the_xla_cpu_device_are_refused():
    (found,) = problems(nproc=2)
    assert found.startswith("nproc = 2 (from flag --nproc): PJRT starts one process per local XLA device (1 on "
                            "PJRT_DEVICE=CPU)")
    assert found.endswith("use 1 (one device) or leave --nproc out")
