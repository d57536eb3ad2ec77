"""`import accelerate` served by acc (the drop-in distribution `accelerate`, version `<Accelerate API>+acc.<acc>`).

This module's names are acc's (`accelerate.Accelerator is acc.Accelerator`); every submodule `accelerate.X` is the
module object `acc.X` itself, not a copy, so state and `isinstance` are shared whichever name a library imports.
The first import in a process tree says on stderr which accelerate this is (`ACC_DROPIN_QUIET=1` silences it).
`pip install --force-reinstall accelerate==<version>` switches back to Hugging Face Accelerate.
"""

from accelerate._alias import become_accelerate

become_accelerate(__import__("sys").modules[__name__])
