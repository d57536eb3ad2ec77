"""Accelerate's `accelerate.utils.imports`: the `is_*_available` checks (acc.runtime.probes), which never import
the package they ask about."""

from acc.runtime.probes import *  # noqa: F401,F403
from acc.runtime.probes import __all__, _is_package_available  # noqa: F401
