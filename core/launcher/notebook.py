"""Launching from a notebook whose kernel already initialised CUDA: workers forked from it cannot use CUDA, so the
launch is refused with what initialised it (variables holding CUDA tensors or models, cells that moved things to
the GPU, libraries that initialise CUDA on import) and what to do. Reads `sys.modules`, never imports torch.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Mapping

_CUDA_LINE = re.compile(r"\.cuda\(|\.to\(\s*['\"]cuda|device\s*=\s*['\"]cuda|['\"]cuda:\d|"
                        r"torch\.cuda\.(init|set_device|synchronize|empty_cache|current_device|get_device_name|"
                        r"get_device_properties|mem_get_info|memory_allocated|FloatTensor|Stream|Event)\b")


_CUDA_ON_IMPORT = ("bitsandbytes",)  # libraries known to initialise CUDA when they are imported


def cuda_initialised(caller: str) -> str:
    """The refusal (what initialised CUDA here and what to do), or '' when CUDA is not initialised."""
    torch = sys.modules.get("torch")
    if torch is None or not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return ""
    culprits = cuda_culprits(_user_namespace())
    found = ("What initialised it: " + "; ".join(culprits) + ".") if culprits else (
        "What initialised it could not be found (no variable of __main__ holds a CUDA tensor or model, and no "
        "notebook cell calls .cuda() or .to('cuda')): a library imported before the launch may have.")
    return (f"{caller}: CUDA is already initialised in this process, and workers forked from it cannot use CUDA "
            f"(\"Cannot re-initialize CUDA in forked subprocess\"). {found} What to do: restart the kernel (or the "
            "program) and keep every use of the GPU inside the launched function (creating the Accelerator, .cuda(), "
            ".to('cuda'), loading a model onto the GPU); torch.cuda.is_available() and torch.cuda.device_count() are "
            "safe before launching. A function defined in a module (not in the notebook) can instead start in fresh "
            "interpreters: start_method='spawn'.")


def _user_namespace() -> Mapping[str, Any]:
    """The notebook's namespace (IPython's user_ns), else `__main__`'s globals."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is not None:
        return shell.user_ns
    return getattr(sys.modules.get("__main__"), "__dict__", {})


def cuda_culprits(namespace: Mapping[str, Any], limit: int = 6) -> list[str]:
    """What in `namespace` (a notebook's or a script's globals) shows CUDA was used: variables holding CUDA
    tensors, models or other objects on a CUDA device, notebook cells (IPython's `In`) that move things to CUDA,
    and imported libraries that initialise CUDA when imported."""
    found: list[str] = []
    for name, obj in list(namespace.items()):
        if name.startswith("_"):
            continue
        where = _on_cuda(obj)
        if where:
            found.append(f"`{name}` ({where})")
    cells = namespace.get("In")
    if isinstance(cells, list):
        for number, source in enumerate(cells):
            for lineno, line in enumerate(str(source).splitlines(), 1):
                if _CUDA_LINE.search(line) and "is_available" not in line:
                    found.append(f"cell In[{number}] line {lineno}: {line.strip()}")
    found += [f"the module {name} (it initialises CUDA when imported)" for name in _CUDA_ON_IMPORT
              if name in sys.modules]
    return found[:limit]


def _on_cuda(obj: Any) -> str:
    torch = sys.modules.get("torch")
    if torch is None or isinstance(obj, type):
        return ""
    try:
        if isinstance(obj, torch.Tensor):
            return f"a tensor on {obj.device}" if obj.device.type == "cuda" else ""
        if isinstance(obj, torch.nn.Module):
            for tensor in (*obj.parameters(), *obj.buffers()):
                if tensor.device.type == "cuda":
                    return f"a {type(obj).__name__} with parameters on {tensor.device}"
            return ""
        device = getattr(obj, "device", None)
        if isinstance(device, torch.device) and device.type == "cuda":
            return f"a {type(obj).__name__} on {device}"
    except Exception:  # noqa: BLE001 - an object whose attributes cannot be read tells nothing
        return ""
    return ""
