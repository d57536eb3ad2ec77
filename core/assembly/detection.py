"""Which backend fits this machine: every installed backend answers `acc_detect`; the best score wins.

Used by `acc.assembly.choose` when no backend was chosen by flag, environment or config file (`acc launch`,
`acc config`). A first-party backend that would fit better but is not installed is named with its install
command. Torch-free.
"""

from __future__ import annotations

from typing import Any, Mapping

from acc.assembly import hardware
from acc.contract.detection import Detection


def suggestions(installed: set[str], environ: Mapping[str, str] | None = None) -> list[Detection]:
    """What first-party backends would offer on this hardware when they are not installed."""
    out = []
    cuda = hardware.visible_cuda_devices(environ)
    if cuda >= 2 and "ddp" not in installed:
        out.append(Detection("ddp", 50, cuda, f"{cuda} CUDA devices found"))
    if hardware.is_apple_silicon(environ) and "mps" not in installed:
        out.append(Detection("mps", 40, 1, "an Apple Silicon GPU found"))
    tpu = hardware.tpu_devices(environ)
    if tpu and "xla" not in installed:
        out.append(Detection("xla", 60, tpu, f"{tpu} TPU chips found"))
    return out


def choose(answers: list[Detection], installed: set[str], environ: Mapping[str, str] | None = None
           ) -> tuple[Detection, str]:
    """The best installed answer and the one-line explanation acc prints."""
    best = max(answers, key=lambda d: (d.score, d.backend == "cpu"))
    missing = [s for s in suggestions(installed, environ) if s.score > best.score]
    where = f"{best.nproc} process{'es' if best.nproc != 1 else ''}"
    if missing:
        m = max(missing, key=lambda d: d.score)
        line = (f"{m.reason}; acc-{m.backend} is not installed (pip install acc-{m.backend}); running {where} with the "
                f"{best.backend} backend")
    else:
        line = f"{best.reason}: running {where} with the {best.backend} backend (detected; choose with --backend)"
    return best, line


def detect(settings: Any, environ: Mapping[str, str] | None = None) -> tuple[Detection, str]:
    """Ask every installed backend (torch-free) and choose."""
    from acc.assembly.plugins import detection_manager

    pm, installed = detection_manager()
    answers = [a for a in pm.hook.acc_detect(settings=settings) if a is not None]
    return choose(answers, installed, environ)
