"""Does this device run a mixed-precision mode natively, or emulate it (slowly)?

The one place that knows which hardware computes bf16/fp16 itself; acc warns once when a run would pay for
emulation (`warn_if_emulated`, called when an `Accelerator` sets up its precision) and `acc check
--mixed-precision MODE` names the finding next to the measured step-time ratio.

- CPU, bf16: native with AVX512-BF16 (`avx512_bf16`) or AMX-BF16 (`amx_bf16`) on x86-64, BF16 (`bf16`) on Arm.
  Without them every bf16 op converts to and from float32: a transformer block step measured 24.5x its fp32 time
  on an AVX2-only AMD EPYC (0.75x on a CPU with avx512_bf16).
- CPU, fp16 autocast (`fp16_on_cpu = true`, or a backend's own fp16 on the CPU): native with AVX512-FP16
  (`avx512_fp16`) or AMX-FP16 (`amx_fp16`) on x86-64, half-precision arithmetic (`asimdhp`) on Arm.
- CUDA, bf16: native from compute capability 8.0 (`torch.cuda.is_bf16_supported(including_emulation=False)`);
  older GPUs that accept bf16 tensors emulate it.
- CUDA, fp16: compute capability 6.1 runs fp16 arithmetic at 1/64 of the fp32 rate; below 5.3 there is none.

`cpu_flags()` is the only function that reads the machine's CPU flags (tests replace it to fake a CPU):
`/proc/cpuinfo` on Linux, `sysctl` on macOS, torch's own cpuinfo probes elsewhere.
"""

from __future__ import annotations

import functools
import platform
import subprocess
import warnings

import torch

CPU_NATIVE = {
    "bf16": ("avx512_bf16", "amx_bf16", "bf16"),
    "fp16": ("avx512_fp16", "amx_fp16", "asimdhp"),
}
CPU_FLAG_NAMES = {
    "bf16": "AVX512-BF16 (avx512_bf16) nor AMX-BF16 (amx_bf16)",
    "fp16": "AVX512-FP16 (avx512_fp16) nor AMX-FP16 (amx_fp16)",
}


class EmulatedPrecisionWarning(UserWarning):
    """The chosen mixed-precision mode is emulated on this device: it may be much slower than float32."""


def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags (lower case, as /proc/cpuinfo spells them), or None when they cannot be read."""
    return _read_cpu_flags()


@functools.lru_cache(maxsize=1)
def _read_cpu_flags() -> frozenset[str] | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):  # x86 / Arm
                    return frozenset(value.lower().split())
    except OSError:
        pass
    if platform.system() == "Darwin":
        found = set()
        for flag, name in (("bf16", "hw.optional.arm.FEAT_BF16"), ("asimdhp", "hw.optional.arm.FEAT_FP16")):
            try:
                out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                return None
            if out.strip() == "1":
                found.add(flag)
        return frozenset(found)
    probes = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_bf16": "_is_amx_tile_supported",
              "amx_fp16": "_is_amx_fp16_supported", "avx2": "_is_avx2_supported"}
    found = set()
    for flag, probe in probes.items():
        fn = getattr(torch.cpu, probe, None)
        if fn is None:
            return None
        try:
            if fn():
                found.add(flag)
        except Exception:  # noqa: BLE001 - a probe that fails tells nothing
            return None
    return frozenset(found)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "this CPU"


def native_support(mode: str, device: torch.device | str) -> tuple[bool | None, str]:
    """(True, why) when `device` computes `mode` natively, (False, why) when it emulates it, (None, why) when
    acc cannot tell (then it says nothing)."""
    device = torch.device(device)
    if mode not in CPU_NATIVE:
        return None, f"no mixed precision ({mode})"
    if device.type == "cpu":
        flags = cpu_flags()
        if flags is None:
            return None, "the CPU's flags could not be read"
        have = [f for f in CPU_NATIVE[mode] if f in flags]
        if have:
            return True, f"native {mode} on the CPU ({', '.join(have)})"
        return False, f"this CPU ({_cpu_name()}) has neither {CPU_FLAG_NAMES[mode]}"
    if device.type == "cuda":
        if getattr(torch.version, "hip", None) or not torch.cuda.is_available():
            return None, "not a CUDA GPU acc can query"
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        if mode == "bf16":
            try:
                with torch.cuda.device(index):
                    native = torch.cuda.is_bf16_supported(including_emulation=False)
            except TypeError:  # a torch without the argument
                native = major >= 8
            if native:
                return True, f"native bf16 on {name} (compute capability {major}.{minor})"
            return False, f"{name} (compute capability {major}.{minor}) has no bf16 arithmetic (needs 8.0+)"
        if (major, minor) == (6, 1) or (major, minor) < (5, 3):
            return False, (f"{name} (compute capability {major}.{minor}) runs fp16 arithmetic at a small fraction "
                           "of its fp32 rate")
        return True, f"native fp16 on {name} (compute capability {major}.{minor})"
    return None, f"acc does not know the {mode} support of '{device.type}' devices"


def emulation_warning(mode: str, device: torch.device | str) -> str | None:
    """The warning for a run of `mode` on `device` when the device emulates it (the reason and what to do);
    None when it is native or unknown."""
    device = torch.device(device)
    native, why = native_support(mode, device)
    if native is not False:
        return None
    if device.type == "cpu":
        better = ("bf16 on a CPU with avx512_bf16/amx_bf16 (Intel Cooper Lake, Sapphire Rapids or later; AMD Zen 4 "
                  "or later) or on a GPU" if mode == "bf16" else
                  "fp16 on a GPU, or bf16 where the CPU has avx512_bf16/amx_bf16")
        cost = "every bf16 op converts to and from float32" if mode == "bf16" else "float16 ops are computed in float32"
    else:
        better = "fp16 on this GPU" if mode == "bf16" else "mixed_precision 'no' or a GPU of compute capability 7.0+"
        cost = f"{mode} is emulated"
    return (f"mixed_precision '{mode}' is emulated on {device.type}: {why}, so {cost}; a step can be many times "
            f"slower than float32 (a transformer block step measured 24x on an AVX2-only CPU). Measure it here "
            f"with `acc check --mixed-precision {mode}`; use mixed_precision 'no' on this machine, or {better}.")


_WARNED: set[tuple[str, str]] = set()


def warn_if_emulated(mode: str, device: torch.device | str) -> str | None:
    """Warn (EmulatedPrecisionWarning), once per process for each mode and device type, when `device` emulates
    `mode`; returns the message (also when it was already given), or None."""
    if mode not in CPU_NATIVE:
        return None
    device = torch.device(device)
    try:
        message = emulation_warning(mode, device)
    except Exception:  # noqa: BLE001 - detection must never stop a run
        return None
    key = (mode, device.type)
    if message is not None and key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, EmulatedPrecisionWarning, stacklevel=2)
    return message
