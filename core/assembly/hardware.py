"""Hardware facts the launcher can read without importing torch (it must stay torch-free).

`ACC_HARDWARE` (JSON, e.g. '{"cuda": 4}' or '{"mps": true}' or '{"tpu": 8}') replaces what is found, to plan
for another machine (`acc launch --dry-run`, `acc config`) or to test detection: every fact below reads it.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Mapping

NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")
OVERRIDE_ENV = "ACC_HARDWARE"


def _override(environ: Mapping[str, str] | None) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    text = environ.get(OVERRIDE_ENV)
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        from acc.errors import ConfigError

        raise ConfigError(f"{OVERRIDE_ENV}={text!r} is not a JSON object such as '{{\"cuda\": 2}}' or '{{\"mps\": true}}'")
    return data


def visible_cuda_devices(environ: Mapping[str, str] | None = None) -> int:
    """How many NVIDIA GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else the driver's count."""
    environ = os.environ if environ is None else environ
    override = _override(environ)
    if "cuda" in override:
        return int(override["cuda"])
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        valid = []
        for e in [e for e in visible.split(",") if e.strip()]:  # CUDA stops at the first invalid entry (e.g. -1)
            if e.strip().startswith("-"):
                break
            valid.append(e)
        return len(valid)
    try:
        return sum(1 for _ in NVIDIA_PROC.iterdir())
    except OSError:
        return 0


def is_apple_silicon(environ: Mapping[str, str] | None = None) -> bool:
    override = _override(environ)
    if "mps" in override:
        return bool(override["mps"])
    return platform.system() == "Darwin" and platform.machine() == "arm64"


# Google's PCI vendor id and the TPU chip ids torch_xla 2.9 knows
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = {"0x0027", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076", "0x0056"}
PCI_DEVICES = Path("/sys/bus/pci/devices")


def tpu_devices(environ: Mapping[str, str] | None = None, pci_root: Path | None = None) -> int:
    """TPU chips attached to this host, read from the PCI bus as torch_xla does (0 when none)."""
    override = _override(environ)
    if "tpu" in override and pci_root is None:
        return int(override["tpu"])
    count = 0
    for vendor in (pci_root or PCI_DEVICES).glob("*/vendor"):
        try:
            if vendor.read_text().strip() == GOOGLE_PCI_VENDOR and \
                    (vendor.parent / "device").read_text().strip() in TPU_PCI_DEVICES:
                count += 1
        except OSError:
            continue
    return count


def overridden(environ: Mapping[str, str] | None = None) -> bool:
    return bool(_override(environ))
