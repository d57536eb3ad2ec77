"""Launching a function, not a script (Accelerate's `accelerate.launchers`): `notebook_launcher`, `debug_launcher`,
and acc's `launch(fn, *args, backend=..., nproc=...)` (also `acc.launch`).

The engine is the one `acc launch` uses; the code is `acc.launcher.functions`. Torch-free to import.
"""

from acc.launcher.functions import WorkerFailedError, debug_launcher, launch, notebook_launcher

__all__ = ["WorkerFailedError", "debug_launcher", "launch", "notebook_launcher"]
