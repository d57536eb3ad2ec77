"""The xla tests run in two lanes.

Main lane (torch 2.13, no torch_xla): the torch-free parts (plan, settings checks, the PJRT executor with a
stand-in torch_xla, the dry run, the install message). Tests that need torch_xla are skipped there, with
the reason. xla lane (`scripts/xla-lane.sh`: torch 2.9.0 + torch-xla 2.9.0, PJRT_DEVICE=CPU, ACC_XLA_LANE=1):
everything, and a torch_xla that does not import is an error, never a skip.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
IN_LANE = os.environ.get("ACC_XLA_LANE") == "1"
HAVE_XLA = importlib.util.find_spec("torch_xla") is not None

if IN_LANE and not HAVE_XLA:
    raise pytest.UsageError("xla lane: torch_xla is not importable in this python "
                            f"({sys.executable}); the lane must run its tests, not skip them")

if importlib.util.find_spec("acc_xla") is None:
    # main lane: import the (torch-free) plugin module from the source tree, without putting plugins/xla on
    # sys.path, where a build's acc_xla.egg-info would make every later test see acc-xla as installed
    _spec = importlib.util.spec_from_file_location(
        "acc_xla", ROOT / "plugins" / "xla" / "acc_xla" / "__init__.py",
        submodule_search_locations=[str(ROOT / "plugins" / "xla" / "acc_xla")])
    sys.modules["acc_xla"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["acc_xla"])

needs_xla = pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (torch 2.9): runs in the xla lane, "
                                                    "scripts/xla-lane.sh")
