"""The mps backend in the worker: device selection, refusals, the fallback variable, mixed-precision checks
and the fp16 gradient scaler."""

from __future__ import annotations

import warnings

import pytest
import torch

import acc
import acc_mps.plugin
from acc import Accelerator
from acc.assembly.plugins import implemented_hooks
from acc_mps import availability, precision
from tests.plugins.mps.conftest import mps_context, requires_no_mps

FALLBACK = "PYTORCH_ENABLE_MPS_FALLBACK"


# ------------------------------------------------------------------------------------- device selection


def test_setup_selects_the_mps_device_for_one_process(mps_pm, fake_mps):
    info = mps_context(mps_pm).process
    assert info.device == torch.device("mps")
    assert (info.num_processes, info.process_index, info.local_process_index, info.local_num_processes) == (1, 0, 0, 1)
    assert info.distributed_type == "NO" and info.native_precision is False  # the kernel does autocast and scaling


def test_accelerator_reports_the_mps_device(mps_pm, fake_mps, monkeypatch):
    monkeypatch.setenv("ACC_BACKEND", "mps")
    accelerator = Accelerator(plugin_manager=mps_pm)
    assert accelerator.backend == "mps" and accelerator.device == torch.device("mps")
    assert accelerator.num_processes == 1 and accelerator.distributed_type == "NO"


def test_cpu_setting_computes_on_the_cpu_and_needs_no_mps(mps_pm, fake_mps):
    fake_mps(available=False, reason="no Mac here")
    assert mps_context(mps_pm, cpu="true").device == torch.device("cpu")


def test_a_process_of_a_distributed_launch_is_refused(mps_pm, fake_mps, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(acc.AccError) as info:
        mps_context(mps_pm)
    assert "one of 2 started by a distributed launcher (WORLD_SIZE=2)" in str(info.value)
    assert "acc launch --backend mps script.py" in str(info.value)


# ------------------------------------------------------------------------------------- MPS unavailable


@requires_no_mps
def test_setup_without_mps_says_why_and_what_to_use_instead(mps_pm):
    with pytest.raises(acc.AccError) as info:
        mps_context(mps_pm)
    msg = str(info.value)
    assert msg.startswith("backend 'mps' cannot run: the MPS device is not available: ")
    assert f"torch {torch.__version__}: torch.backends.mps.is_built() = {torch.backends.mps.is_built()}, " \
           "is_available() = False" in msg
    assert "use --backend cpu instead" in msg


def _supported_mac(monkeypatch, built: bool, available: bool) -> None:
    import platform

    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    monkeypatch.setattr(platform, "mac_ver", lambda: ("14.5", ("", "", ""), "arm64"))
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: built)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: available)


def test_status_separates_a_torch_without_mps_from_mps_being_unavailable(monkeypatch):
    _supported_mac(monkeypatch, built=False, available=False)
    status = availability.mps_status()
    assert not status.available and status.facts["mps.is_built()"] == "False"
    assert status.reason == (f"this torch ({torch.__version__}) was built without MPS (torch.backends.mps.is_built() "
                             "is False); install the macOS arm64 build: pip install torch, from a native arm64 Python")
    _supported_mac(monkeypatch, built=True, available=False)
    status = availability.mps_status()
    assert not status.available and status.facts["mps.is_built()"] == "True"
    assert "torch.backends.mps.is_available() is False" in status.reason and "virtual machine" in status.reason
    _supported_mac(monkeypatch, built=True, available=True)
    status = availability.mps_status()
    assert (status.available, status.reason, status.facts["mps.is_available()"]) == (True, "", "True")


# ------------------------------------------------------------------------------------- PYTORCH_ENABLE_MPS_FALLBACK


def test_fallback_on_but_variable_unset_warns_that_it_is_too_late(mps_pm, fake_mps, monkeypatch):
    monkeypatch.delenv(FALLBACK, raising=False)
    with pytest.warns(UserWarning, match=f"mps_fallback is on \\(from flag --mps-fallback\\), but {FALLBACK} was not"):
        mps_context(mps_pm, mps_fallback="true")


def test_fallback_on_with_variable_set_is_silent(mps_pm, fake_mps, monkeypatch):
    monkeypatch.setenv(FALLBACK, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mps_context(mps_pm, mps_fallback="true").device == torch.device("mps")


# ------------------------------------------------------------------------------------- mixed precision


@pytest.fixture
def probe_calls(monkeypatch):
    """Fake the step that runs on the device: the probe reports what autocast on MPS would produce."""
    calls: list = []

    def install(result=None, warned=(), error=None):
        def fake(device, dtype):
            calls.append((device, dtype))
            if error is not None:
                raise error
            return (dtype if result is None else result), list(warned)

        monkeypatch.setattr(precision, "probe", fake)
        return calls

    return install


@pytest.mark.parametrize("mode,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_mixed_precision_is_accepted_when_autocast_takes_effect(mps_pm, fake_mps, probe_calls, mode, dtype):
    calls = probe_calls()
    assert mps_context(mps_pm, mixed_precision=mode).device == torch.device("mps")
    assert calls == [(torch.device("mps"), dtype)]  # checked on the device, in the dtype asked for


def test_bf16_before_macos_14_is_refused_with_the_reason(mps_pm, fake_mps, probe_calls):
    fake_mps(macos=(13, 6))
    calls = probe_calls()
    with pytest.raises(acc.AccError) as info:
        mps_context(mps_pm, mixed_precision="bf16")
    assert str(info.value) == ("mixed_precision 'bf16' on MPS needs macOS 14.0 or newer (bfloat16 came to Metal with "
                               "macOS 14), but this Mac runs macOS 13.6; use mixed_precision 'fp16' or 'no', or "
                               "update macOS")
    assert calls == []
    assert mps_context(mps_pm, mixed_precision="fp16").device == torch.device("mps")


def test_autocast_that_quietly_falls_back_to_float32_is_refused(mps_pm, fake_mps, probe_calls):
    note = "In MPS autocast, but the target dtype is not supported. Disabling autocast."
    probe_calls(result=torch.float32, warned=[note])
    with pytest.raises(acc.AccError) as info:
        mps_context(mps_pm, mixed_precision="fp16")
    assert str(info.value) == (
        f"mixed_precision 'fp16' would not take effect on MPS with torch {torch.__version__} on macOS 14.5: a matmul "
        f"under torch.autocast('mps', dtype=torch.float16) computed in torch.float32 (torch warned: {note}); use "
        "mixed_precision 'no'"
    )


def test_autocast_that_fails_on_the_device_is_refused(mps_pm, fake_mps, probe_calls):
    probe_calls(error=RuntimeError("MPS does not support bfloat16 matmul\nmore detail"))
    with pytest.raises(acc.AccError) as info:
        mps_context(mps_pm, mixed_precision="bf16")
    assert str(info.value) == (f"mixed_precision 'bf16' does not work on MPS with torch {torch.__version__} on macOS "
                               "14.5: RuntimeError: MPS does not support bfloat16 matmul; use mixed_precision "
                               "'fp16' or 'no'")


def test_a_torch_without_mps_autocast_is_refused(mps_pm, fake_mps, probe_calls, monkeypatch):
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: device_type != "mps")
    probe_calls()
    with pytest.raises(acc.AccError) as info:
        mps_context(mps_pm, mixed_precision="fp16")
    assert str(info.value) == (f"mixed_precision 'fp16' needs autocast on MPS, which torch {torch.__version__} on "
                               "macOS 14.5 does not provide; upgrade torch, or use mixed_precision 'no'")


def test_probe_measures_what_autocast_really_computed():
    # the real probe, on the CPU (the device this machine has): an active autocast casts the matmul ...
    assert precision.probe(torch.device("cpu"), torch.bfloat16) == (torch.bfloat16, [])
    # ... and one torch disables (here: a dtype CPU autocast lacks) computes in float32, with torch's warning
    dtype, warned = precision.probe(torch.device("cpu"), torch.float64)
    assert dtype == torch.float32
    assert warned == ["In CPU autocast, but the target dtype is not supported. Disabling autocast."]


def test_fp16_scaler_is_torchs_gradscaler_for_mps(mps_pm, fake_mps):
    assert "acc_grad_scaler" not in implemented_hooks(acc_mps.plugin)  # the default is right for MPS
    ctx = mps_context(mps_pm)
    scaler = mps_pm.hook.acc_grad_scaler(ctx=ctx, kwargs={"init_scale": 1024.0})
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled()
    assert scaler._device == "mps"  # torch keeps the device type here; its unscale_ has an MPS path (no float64)
    assert scaler.get_scale() == 1024.0
