"""Whether this process can use the MPS device, and why not: `mps_status` is the one place the backend
decides it (tests replace that function to fake an Apple Silicon Mac).

Importing this module is torch-free; `mps_status(with_torch=False)` (the launcher's question) decides from
platform facts alone, `mps_status()` (the worker's) also asks torch.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
from dataclasses import dataclass, field

from acc import backend as sdk

FALLBACK_ENV = "PYTORCH_ENABLE_MPS_FALLBACK"
BF16_MIN_MACOS = (14, 0)  # bfloat16 arrived in Metal with macOS 14 (Sonoma)


@dataclass(frozen=True)
class MpsStatus:
    """The answer: `available`, else `reason` (in words); `macos` is None off macOS; `facts` decided it."""

    available: bool
    reason: str = ""
    macos: tuple[int, ...] | None = None
    facts: dict[str, str] = field(default_factory=dict)


def version_tuple(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string: '2.13.0+cpu' -> (2, 13, 0), '14.5' -> (14, 5)."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)


def lacks_bf16(macos: tuple[int, ...] | None) -> bool:
    """True on a macOS known to be older than bfloat16 on MPS needs (unknown or pre-11 readings: False)."""
    return bool(macos) and macos[0] >= 11 and macos < BF16_MIN_MACOS


def installed_torch() -> str | None:
    """torch's version from its package metadata (torch is not imported)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def minimum_macos(torch_version: str | None) -> tuple[int, int]:
    """The oldest macOS on which this torch offers MPS: 14.0 from torch 2.10 on, 13.0 for torch 2.9."""
    parsed = version_tuple(torch_version or "")
    return (13, 0) if parsed and parsed[:2] < (2, 10) else (14, 0)


def _platform_reason(system: str, machine: str, macos: tuple[int, ...] | None, need: tuple[int, int],
                     torch_version: str) -> str:
    if system != "Darwin":
        return f"this machine runs {system} ({machine}); MPS exists only on macOS on Apple Silicon (arm64)"
    if not sdk.is_apple_silicon():
        return (f"this Mac reports machine type {machine}: an Intel Mac, or an x86_64 Python running under "
                "Rosetta 2; MPS needs Apple Silicon and a native arm64 Python")
    # a version below 11 ("10.16") is what Pythons built with an old SDK report: let torch decide then
    if macos and macos[0] >= 11 and macos < need:
        return (f"this Mac runs macOS {dotted(macos)}, and torch {torch_version} offers MPS from macOS "
                f"{dotted(need)} on; update macOS (`sw_vers` shows the version)")
    return ""


def _torch_reason(platform_ok: bool) -> tuple[str, dict[str, str]]:
    import torch

    built = bool(torch.backends.mps.is_built())
    available = built and bool(torch.backends.mps.is_available())
    facts = {"mps.is_built()": str(built), "mps.is_available()": str(available)}  # torch.backends.*
    if available:
        return "", facts
    if not built:
        reason = f"this torch ({torch.__version__}) was built without MPS (torch.backends.mps.is_built() is False)"
        if platform_ok:
            reason += "; install the macOS arm64 build: pip install torch, from a native arm64 Python"
    else:
        reason = ("torch was built with MPS (torch.backends.mps.is_built() is True), but "
                  "torch.backends.mps.is_available() is False")
        if platform_ok:
            reason += "; on a supported Mac this usually means a virtual machine or session without Metal GPU access"
    return reason, facts


def mps_status(with_torch: bool = True) -> MpsStatus:
    """Whether MPS can be used here. Without torch: from platform facts (Apple Silicon, macOS version);
    with torch: torch's `is_built()`/`is_available()` decide, the platform facts explain."""
    system, machine = platform.system(), platform.machine()
    mac = platform.mac_ver()[0] if system == "Darwin" else ""
    macos = version_tuple(mac) or None
    installed = installed_torch()
    torch_version = installed or "(not installed)"
    need = minimum_macos(installed)
    facts = {
        "platform": f"{system} {machine}",
        "macOS": mac or "-",
        "torch": torch_version,
        "MPS needs": f"Apple Silicon (arm64), macOS {dotted(need)}+ (for torch {torch_version})",
    }
    reason = _platform_reason(system, machine, macos, need, torch_version)
    if not with_torch:
        if sdk.overridden():  # planning for another machine (ACC_HARDWARE): its answer stands
            planned = sdk.is_apple_silicon()
            facts["platform"] += f" (planning with {sdk.OVERRIDE_ENV})"
            return MpsStatus(planned, "" if planned else f"{sdk.OVERRIDE_ENV} says there is no Apple GPU",
                             macos or need, facts)
        return MpsStatus(not reason, reason, macos, facts)
    torch_reason, torch_facts = _torch_reason(platform_ok=not reason)
    facts.update(torch_facts)
    if not torch_reason:  # torch can use the device: it has the last word
        return MpsStatus(True, "", macos, facts)
    return MpsStatus(False, "; ".join(r for r in (reason, torch_reason) if r), macos, facts)


def use_instead() -> str:
    """What to run when MPS is not available."""
    return ("use --backend cpu instead (the default backend: the CPU, or the one visible CUDA GPU), or set "
            "ACC_BACKEND=cpu / backend = \"cpu\" in acc.toml")
