"""`acc estimate-memory`: figures per dtype computed on the meta device, the largest layer, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from acc.cli import cli
from tests.conftest import ACC, run

MODELS = textwrap.dedent("""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.up = nn.Linear(d, 4 * d)
            self.down = nn.Linear(4 * d, d)

    class Net(nn.Module):
        def __init__(self, n=3, d=64, vocab=1000):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block(d) for _ in range(n))
            self.register_buffer("pos", torch.arange(16, dtype=torch.float32))

    def build(n, d=64):
        return Net(n=n, d=d)

    def huge():
        return nn.Sequential(*[nn.Linear(50_000, 50_000) for _ in range(3)])  # 30 GB of float32

    def not_a_model():
        return 42
""")


@pytest.fixture
def models(tmp_path: Path) -> str:
    """A module of model factories in the working directory, under a fresh name (no stale import)."""
    name = f"models_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(MODELS)
    yield name
    sys.modules.pop(name, None)


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, prog_name="acc")


def reference(module_name: str, *args, **kwargs):
    """The same model built for real, to count independently of acc."""
    import importlib

    return importlib.import_module(module_name).build(*args, **kwargs)


def test_figures_per_dtype_match_the_real_model(models):
    result = invoke("estimate-memory", f"{models}:build", "2", "d=32", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    real = reference(models, 2, d=32)
    count = sum(p.numel() for p in real.parameters())
    assert report["model"] == "Net" and report["parameters"] == count
    assert report["buffers_bytes"] == 16 * 4
    for dtype, size in (("float32", 4), ("float16/bfloat16", 2), ("int8", 1)):
        row = report["dtypes"][dtype]
        assert row["parameters_bytes"] == count * size
        assert row["training_bytes"] == (4 * count * size if size > 1 else None)  # weights + grads + 2 Adam moments
    largest = max(real.modules(), key=lambda m: sum(p.numel() for p in m.parameters()) if not list(m.children()) else 0)
    assert report["largest_layer"] == {"name": "embed", "class": "Embedding"} and largest is real.embed
    assert report["dtypes"]["float32"]["largest_layer_bytes"] == real.embed.weight.numel() * 4


def test_no_split_makes_the_largest_layer_a_block_and_text_output(models):
    result = invoke("estimate-memory", f"{models}:Net", "n=2", "vocab=10", "--no-split", "Block")
    assert result.exit_code == 0, result.output
    real = reference(models, 2, d=64)
    block = sum(p.numel() for p in real.blocks[0].parameters())
    lines = result.output.splitlines()
    assert "largest layer (blocks.0, Block)" in lines[1]
    float32 = lines[2].split()
    assert float32[0] == "float32" and float32[-2:] == [f"{block * 4 / 1e3:.2f}", "KB"]
    assert "4 x the parameters" in result.output


def test_a_30_gb_model_is_estimated_without_allocating_it(models, tmp_path):
    proc = run([ACC, "estimate-memory", f"{models}:huge", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["dtypes"]["float32"]["parameters_bytes"] == 3 * 50_000 * 50_001 * 4  # 30 GB on a 24 GB machine


@pytest.mark.parametrize("target, message", [
    ("no_such_package.models:build", "cannot import 'no_such_package.models': there is no module named 'no_such_package'"),
    ("{models}:biuld", "has no attribute 'biuld' (did you mean 'build'?)"),
    ("{models}:not_a_model", "returned a value of type int, not a torch.nn.Module"),
    ("{models}", "give the model as package.module:factory or package.module:ClassName"),
    ("{models}:build", "building '{models}:build' failed: TypeError"),  # the required argument is missing
])
def test_bad_input_is_a_clear_error_with_exit_code_2(models, target, message):
    result = invoke("estimate-memory", target.format(models=models))
    assert result.exit_code == 2, result.output
    assert message.format(models=models) in result.output and "Traceback" not in result.output


def test_the_cli_stays_torch_free_with_the_command_registered():
    code = ("import sys\nfrom acc.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('TORCH', 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "estimate-memory" in proc.stdout and "TORCH False" in proc.stdout, proc.stdout + proc.stderr
