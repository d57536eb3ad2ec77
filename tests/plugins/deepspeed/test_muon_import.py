"""DeepSpeed's Muon module, which every ZeRO engine imports, is imported without compiling its kernels at import
(acc_deepspeed/muon_import.py): engines on real processes load no compiler, and Muon's functions still compile."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import read_rank_results
from tests.plugins.ddp.test_ddp import acc_launch

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stage", ["2", "3"])
def test_a_zero_engine_trains_without_loading_the_compiler(tmp_path, stage):
    # without acc's import, DeepSpeed's check for Muon decorates three functions with torch.compile, which loads
    # inductor, aot_autograd and networkx (594 modules, 45 MiB) in every process
    acc_launch(tmp_path, ["--backend", "deepspeed", "--zero-stage", stage, "--nproc", "2"], "engine_imports.py",
               ["--out", str(tmp_path / "out")])
    results = read_rank_results(tmp_path / "out")
    assert sorted(results) == [0, 1]
    for rank, res in results.items():
        assert res == {"loaded": [], "muon_imported": True}, (rank, res)


PROBE = r"""
import json, sys, torch
from acc_deepspeed.muon_import import import_without_compiling
import_without_compiling()
before = "torch._inductor.compile_fx" in sys.modules
from deepspeed.runtime.zero.muon.original_muon import zeropower_via_newtonschulz5 as orthogonalise
g = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
compiled = orthogonalise(g, 5)
after = "torch._inductor.compile_fx" in sys.modules
decorated = torch.compile(orthogonalise.__wrapped__)(g, 5)  # what DeepSpeed's own decoration makes of it
print(json.dumps({"compiler_before_call": before, "compiler_after_call": after,
                  "equal_to_decorated": torch.equal(compiled, decorated), "dtype": str(compiled.dtype)}))
"""


def test_muons_functions_are_compiled_on_their_first_call():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["compiler_before_call"] is False
    assert res["compiler_after_call"] is True  # the first call compiled it with inductor
    assert res["equal_to_decorated"] is True, res  # the same compiled function as DeepSpeed's decoration gives
