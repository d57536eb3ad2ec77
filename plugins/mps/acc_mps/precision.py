"""Mixed precision on MPS: checks made at setup, before the kernel's generic `check_supported`.

torch does not always fail when autocast cannot run a dtype on MPS: some releases warn and quietly
disable autocast (e.g. bfloat16 before macOS 14), and training would then run in float32. So the check
runs one matmul under autocast on the device and compares the dtype that came out with the one asked for.
"""

from __future__ import annotations

import warnings
from typing import Any

from acc import backend as sdk

from .availability import BF16_MIN_MACOS, MpsStatus, dotted, lacks_bf16

ALTERNATIVE = {"bf16": "'fp16' or 'no'", "fp16": "'no'"}


def probe(device: Any, dtype: Any) -> tuple[Any, list[str]]:
    """The dtype of one matmul under `torch.autocast(device.type, dtype)` on `device`, and torch's warnings."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(device.type, dtype=dtype):
            x = torch.ones(2, 2, device=device)
            out = x @ x
    return out.dtype, [str(w.message).splitlines()[0] for w in caught]


def check(mode: str, device: Any, status: MpsStatus) -> None:
    """Raise sdk.AccError when mixed precision `mode` cannot run on the MPS `device`, saying why and what to use."""
    if mode == "no":
        return
    import torch

    where = f"torch {torch.__version__} on macOS {status.facts.get('macOS', '?')}"
    if mode == "bf16" and lacks_bf16(status.macos):
        raise sdk.AccError(f"mixed_precision 'bf16' on MPS needs macOS {dotted(BF16_MIN_MACOS)} or newer (bfloat16 "
                       f"came to Metal with macOS 14), but this Mac runs macOS {dotted(status.macos)}; use "
                       "mixed_precision 'fp16' or 'no', or update macOS")
    if not torch.amp.is_autocast_available(device.type):
        raise sdk.AccError(f"mixed_precision '{mode}' needs autocast on MPS, which {where} does not provide; "
                       f"upgrade torch, or use mixed_precision 'no'")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[mode]
    try:
        got, warned = probe(device, dtype)
    except Exception as exc:  # noqa: BLE001 - any failure means the mode is unusable here
        raise sdk.AccError(f"mixed_precision '{mode}' does not work on MPS with {where}: {type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}; use mixed_precision "
                       f"{ALTERNATIVE[mode]}") from None
    if got != dtype:
        said = f" (torch warned: {warned[0]})" if warned else ""
        raise sdk.AccError(f"mixed_precision '{mode}' would not take effect on MPS with {where}: a matmul under "
                       f"torch.autocast('mps', dtype={dtype}) computed in {got}{said}; use mixed_precision "
                       f"{ALTERNATIVE[mode]}")
