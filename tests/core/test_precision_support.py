"""Mixed precision the device only emulates is warned about once, when the Accelerator is created.

The CPU's flags are faked in one place (`fake_cpu_flags`, through `acc.runtime.precision_support.cpu_flags`, the only
reader of the machine's flags), and the real CPU is checked against its own /proc/cpuinfo.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from acc import Accelerator
from acc.runtime import precision_support
from acc.runtime.precision_support import EmulatedPrecisionWarning

AVX2_ONLY = {"fpu", "sse2", "avx", "avx2", "fma"}  # the AMD EPYC where bf16 made a step 24x slower


@pytest.fixture
def fake_cpu_flags(monkeypatch):
    """fake_cpu_flags(flags): this process's CPU has exactly these flags (None: unreadable); warnings reset."""
    monkeypatch.setattr(precision_support, "_WARNED", set())

    def fake(flags):
        monkeypatch.setattr(precision_support, "cpu_flags", lambda: None if flags is None else frozenset(flags))

    return fake


def emulation_warnings(make) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()
    return [str(w.message) for w in caught if issubclass(w.category, EmulatedPrecisionWarning)]


def test_bf16_on_a_cpu_without_avx512_bf16_or_amx_warns_once_with_the_reason_and_what_to_do(fake_cpu_flags, fresh_pm):
    fake_cpu_flags(AVX2_ONLY)
    found = emulation_warnings(lambda: [Accelerator(plugin_manager=fresh_pm, cpu=True, mixed_precision="bf16")
                                        for _ in range(2)])
    assert len(found) == 1, found  # once per process, however many Accelerators
    message = found[0]
    assert "mixed_precision 'bf16' is emulated on cpu" in message
    assert "neither AVX512-BF16 (avx512_bf16) nor AMX-BF16 (amx_bf16)" in message
    assert "acc check --mixed-precision bf16" in message and "use mixed_precision 'no'" in message


@pytest.mark.parametrize("flags", [AVX2_ONLY | {"avx512f", "avx512_bf16"}, AVX2_ONLY | {"amx_tile", "amx_bf16"},
                                   {"fp", "asimd", "bf16"}])  # Zen 4 / Cooper Lake, Sapphire Rapids, Arm v8.6
def test_bf16_on_a_cpu_with_native_bf16_says_nothing(fake_cpu_flags, fresh_pm, flags):
    fake_cpu_flags(flags)
    assert emulation_warnings(lambda: Accelerator(plugin_manager=fresh_pm, cpu=True, mixed_precision="bf16")) == []
    assert precision_support.native_support("bf16", "cpu")[0] is True


def test_fp16_autocast_on_the_cpu_warns_unless_it_has_avx512_fp16_or_amx_fp16(fake_cpu_flags, fresh_pm, monkeypatch):
    fake_cpu_flags(AVX2_ONLY | {"avx512_bf16"})
    # by default fp16 on the CPU trains in float32 (as in Accelerate): nothing is emulated, nothing to warn about
    assert emulation_warnings(lambda: Accelerator(plugin_manager=fresh_pm, cpu=True, mixed_precision="fp16")) == []
    monkeypatch.setenv("ACC_FP16_ON_CPU", "1")  # float16 autocast with a scaler on the CPU
    found = emulation_warnings(lambda: Accelerator(plugin_manager=fresh_pm, cpu=True, mixed_precision="fp16"))
    assert len(found) == 1 and "neither AVX512-FP16 (avx512_fp16) nor AMX-FP16 (amx_fp16)" in found[0]
    fake_cpu_flags(AVX2_ONLY | {"avx512_fp16"})
    precision_support._WARNED.clear()
    assert emulation_warnings(lambda: Accelerator(plugin_manager=fresh_pm, cpu=True, mixed_precision="fp16")) == []


def test_unknown_flags_and_no_mixed_precision_say_nothing(fake_cpu_flags, fresh_pm):
    fake_cpu_flags(None)
    assert emulation_warnings(lambda: Accelerator(plugin_manager=fresh_pm, cpu=True, mixed_precision="bf16")) == []
    fake_cpu_flags(AVX2_ONLY)
    assert emulation_warnings(lambda: Accelerator(plugin_manager=fresh_pm, cpu=True)) == []


def real_flags() -> set[str] | None:
    """This machine's flags, read here independently of acc."""
    path = Path("/proc/cpuinfo")
    if not path.is_file():
        return None
    for line in path.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.lower().split())
    return None


def test_the_real_cpu_warning_matches_its_flags(fresh_pm, monkeypatch):
    monkeypatch.setattr(precision_support, "_WARNED", set())
    flags = real_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo flags on this machine")
    native = bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    assert precision_support.cpu_flags() == frozenset(flags)
    found = emulation_warnings(lambda: Accelerator(plugin_manager=fresh_pm, cpu=True, mixed_precision="bf16"))
    print(f"real CPU: native bf16 {native}; bf16-related flags {sorted(f for f in flags if 'bf16' in f or 'amx' in f)}")
    assert (found != []) == (not native), found


@pytest.mark.cuda
def test_the_real_gpu_warning_matches_torch(fresh_pm, monkeypatch):
    monkeypatch.setattr(precision_support, "_WARNED", set())
    found = emulation_warnings(lambda: Accelerator(plugin_manager=fresh_pm, mixed_precision="bf16"))
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    assert (found != []) == (not native), found
    assert precision_support.native_support("bf16", "cuda")[0] is native
