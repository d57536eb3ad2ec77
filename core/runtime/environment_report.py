"""What a bug report says about this machine and this install: system RAM, numpy's version, what torch sees (its
version, the accelerator under the name `accelerate env` gives it, that device's type), the config a run resolves
and what each installed backend and plugin reports about itself (`acc_env_report`); credentials are redacted.

`acc env` (`acc.cli.env`) and Accelerate's `env_command` (`acc.commands.env`) print these. It lives in the worker
runtime because it reports torch's own view of the process: torch, numpy and each plugin's module are imported by
the functions that read them, never when this module is imported (the assembly below it stays torch-free).
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass, field
from typing import Any

from acc.assembly.plugins import installed_backends, installed_plugins
from acc.assembly.redact import redact_value
from acc.errors import AccError
from acc.runtime.devices import vendor_device

# out-of-tree torch backends, in the order `accelerate env` checks them: (its name, the module, torch's attribute)
_VENDORS = (("MLU", "torch_mlu", "mlu"), ("SDAA", "torch_sdaa", "sdaa"), ("MUSA", "torch_musa", "musa"),
            ("NPU", "torch_npu", "npu"), ("NEURON", "torch_neuronx", "neuron"))


@dataclass(frozen=True)
class TorchView:
    """torch's version, the accelerator it sees (CUDA, XPU, MLU, SDAA, MUSA, NPU, NEURON, MPS or N/A) and rows
    naming that device (`GPU type`, `XPU type`, ..., `CANN version` for an NPU), as `accelerate env` names them."""

    version: str
    accelerator: str
    device_rows: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PluginReport:
    """One installed backend or plugin: its name, distribution and version, and what its `acc_env_report` said
    (values redacted), or `error` when loading it or its report failed."""

    name: str
    distribution: str
    version: str
    rows: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def system_ram() -> str:
    """The machine's physical memory, e.g. '31.26 GB' (GiB, as `accelerate env` prints it), or 'unknown'."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "unknown"
    return f"{total / 1024 ** 3:.2f} GB"


def numpy_version() -> str:
    """numpy's version, or 'not installed'."""
    try:
        import numpy
    except ImportError:
        return "not installed"
    return str(numpy.__version__)


def _mps_type() -> str:
    try:
        return subprocess.check_output(["sysctl", "-n", "machdep.cpu.brand_string"], text=True, timeout=10).strip()
    except Exception:  # noqa: BLE001 - no sysctl: the processor's name is the next best answer
        return platform.processor() or "Apple Silicon"


def torch_view() -> TorchView:
    """What torch sees here; 'not installed' and 'N/A' when torch is missing."""
    try:
        import torch
    except ImportError:
        return TorchView("not installed", "N/A")
    version = str(torch.__version__)
    if torch.cuda.is_available():
        return TorchView(version, "CUDA", (("GPU type", torch.cuda.get_device_name()),))
    if getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        return TorchView(version, "XPU", (("XPU type", torch.xpu.get_device_name()),))
    for name, module, attr in _VENDORS:
        if vendor_device(module, attr, check_device=False):
            if name == "NPU":
                return TorchView(version, name, (("CANN version", str(getattr(torch.version, "cann", None))),))
            return TorchView(version, name, ((f"{name} type", getattr(torch, attr).get_device_name()),))
    if torch.backends.mps.is_available():
        return TorchView(version, "MPS", (("MPS type", _mps_type()),))
    return TorchView(version, "N/A")


def torch_rows() -> list[tuple[str, str]]:
    """`acc env`'s torch rows: ('torch', version), ('torch accelerator', name) and the device's rows."""
    view = torch_view()
    return [("torch", view.version), ("torch accelerator", view.accelerator), *view.device_rows]


def config_rows(assembly: Any) -> list[tuple[str, str]]:
    """The config an assembled run (`acc.assembly.choose.assemble`) came from: ('files', which files were read)
    and, for each setting that is not at its default, (name, 'value  (where it came from)'), credentials redacted."""
    files = ", ".join(f"{f.path} ({f.label})" for f in assembly.files)
    rows = [("files", files or "none found (settings from flags, ACC_* variables and defaults)")]
    settings = assembly.settings
    for name in settings:
        if not settings.is_default(name):
            value = redact_value(name, settings[name])  # a credential-like setting is not shown
            shown = ",".join(value) if isinstance(value, list) else str(value)
            rows.append((name, f"{shown}  ({settings.source(name)})"))
    return rows


def plugin_reports(settings: Any) -> list[PluginReport]:
    """Every installed backend (the builtin cpu first) and plugin, each loaded and asked for its `acc_env_report`
    with the run's resolved `settings`. A plugin that fails to load or to report is reported with its error."""
    reports = []
    for info in [*installed_backends().values(), *installed_plugins().values()]:
        name, distribution, version = info.name, info.distribution, info.version
        try:
            module = info.load_module()
            report_fn = getattr(module, "acc_env_report", None)
            report = report_fn(settings=settings) if report_fn else None
        except AccError as exc:
            reports.append(PluginReport(name, distribution, version, error=f"error: {exc}"))
            continue
        except Exception as exc:  # noqa: BLE001 - a plugin's report failing is itself a fact worth reporting
            reports.append(PluginReport(name, distribution, version,
                                        error=f"error while reporting: {type(exc).__name__}: {exc}"))
            continue
        rows = {str(k): str(redact_value(str(k), v)) for k, v in (report or {}).items()}
        reports.append(PluginReport(name, distribution, version, rows=rows))
    return reports


__all__ = ["PluginReport", "TorchView", "config_rows", "numpy_version", "plugin_reports", "system_ram", "torch_rows", "torch_view"]
