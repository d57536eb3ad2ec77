"""acc's `accelerate` drop-in (plugins/accelerate) in a venv with transformers and no Hugging Face Accelerate:
transformers finds it, every `accelerate.X` is acc's module object, every name transformers imports from
`accelerate` resolves, and `acc env` says which accelerate is installed."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "TRANSFORMERS_VERBOSITY": "error"}
ENV.pop("ACC_DROPIN_SAID", None)
ENV.pop("ACC_DROPIN_QUIET", None)

# Accelerate's module map (what scripts and libraries import as accelerate.X)
MODULES = ("accelerator", "state", "data_loader", "big_modeling", "hooks", "checkpointing", "launchers", "local_sgd",
           "logging", "optimizer", "scheduler", "tracking", "inference", "parallelism_config", "utils",
           "utils.constants", "utils.dataclasses", "utils.modeling", "utils.offload", "utils.operations",
           "utils.memory", "utils.random", "utils.launch", "utils.imports", "utils.other", "utils.fsdp_utils",
           "utils.deepspeed", "commands.launch", "commands.config", "commands.env", "commands.estimate",
           "commands.test", "commands.merge", "test_utils.testing", "test_utils.training")


def run(python: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], capture_output=True, text=True, env=ENV, cwd=cwd, timeout=600)


def test_transformers_finds_the_drop_in_as_accelerate(dropin_python):
    proc = run(dropin_python, "-c", "import transformers; from transformers.utils import is_accelerate_available; "
               "print(is_accelerate_available())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "True"
    proc = run(dropin_python, "-c", "import importlib.metadata as m, accelerate, acc; "
               "print(m.version('accelerate'), accelerate.__version__, accelerate.Accelerator is acc.Accelerator)")
    assert proc.returncode == 0, proc.stderr
    from acc.contract.version import __accelerate_version__, __version__

    want = f"{__accelerate_version__}+acc.{__version__}"
    assert proc.stdout.split() == [want, want, "True"]


def test_every_accelerate_submodule_is_accs_module_object(dropin_python):
    code = (
        "import importlib, json\n"
        f"names = {list(MODULES)!r}\n"
        "same = {n: importlib.import_module('accelerate.' + n) is importlib.import_module('acc.' + n) for n in names}\n"
        "spec = {n: importlib.import_module('acc.' + n).__spec__.name for n in names}\n"
        "import accelerate.utils, acc.utils\n"
        "print(json.dumps({'same': same, 'spec': spec, 'attr': accelerate.utils is acc.utils}))\n"
    )
    proc = run(dropin_python, "-c", code)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert [n for n, same in found["same"].items() if not same] == []
    # acc's modules keep their own spec (acc.big_modeling is acc.big_model's face, under its name)
    assert {n: spec for n, spec in found["spec"].items() if not spec.startswith("acc.")} == {}
    assert found["attr"]


def test_the_first_import_says_which_accelerate_this_is_once_per_process_tree(dropin_python):
    code = ("import subprocess, sys, accelerate\n"
            "subprocess.run([sys.executable, '-c', 'import accelerate'], check=True)\n")
    proc = run(dropin_python, "-c", code)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("accelerate: this is acc")]
    assert len(said) == 1, proc.stderr
    assert "Accelerate's API level 1.15.0" in said[0] and "pip install --force-reinstall accelerate==1.15.0" in said[0]
    quiet = subprocess.run([str(dropin_python), "-c", "import accelerate"], capture_output=True, text=True,
                           env={**ENV, "ACC_DROPIN_QUIET": "1"}, timeout=120)
    assert quiet.returncode == 0 and "accelerate: this is" not in quiet.stderr


def test_acc_env_says_which_accelerate_is_installed(dropin_python):
    proc = run(dropin_python, "-m", "acc", "env")
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("import accelerate"))
    assert "acc 0.1.0 at Accelerate's API level 1.15.0" in line
    proc = subprocess.run([sys.executable, "-m", "acc", "env"], capture_output=True, text=True, timeout=120)
    line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("import accelerate"))
    assert line.split(None, 2)[2] == "not installed"  # the main lane's venv has no accelerate distribution


def _accelerate_imports(site: Path, package: str) -> list[tuple[str, str]]:
    """Every (module, name) that `package` imports from accelerate (transformers: outside its models/)."""
    found: set[tuple[str, str]] = set()
    for path in (site / package).rglob("*.py"):
        if package == "transformers" and "models" in path.relative_to(site / package).parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "accelerate":
                found.update((node.module, alias.name) for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update((alias.name, "") for alias in node.names if alias.name.split(".")[0] == "accelerate")
    return sorted(found)


@pytest.mark.parametrize("package,least", [("transformers", 40), ("peft", 10), ("diffusers", 15)])
def test_every_name_a_library_imports_from_accelerate_resolves(dropin_python, package, least):
    site = next((dropin_python.parent.parent / "lib").glob("python3.*/site-packages"))
    wanted = _accelerate_imports(site, package)
    assert len(wanted) >= least, wanted  # the scan sees the library's imports (5.23: 46; peft 0.21: 17; diffusers: 22)
    code = ("import importlib, json, sys\n"
            f"wanted = {wanted!r}\n"
            "missing = []\n"
            "for module, name in wanted:\n"
            "    try:\n"
            "        m = importlib.import_module(module)\n"
            "        if name:\n"
            "            getattr(m, name)\n"
            "    except Exception as exc:\n"
            "        missing.append(f'{module}.{name}: {type(exc).__name__}: {exc}')\n"
            "print(json.dumps(missing))\n")
    proc = run(dropin_python, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_transformers_trainer_imports(dropin_python):
    proc = run(dropin_python, "-c", "from transformers import Trainer, TrainingArguments; print('ok')")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr


def test_the_accelerate_command_is_accs(dropin_python):
    proc = subprocess.run([str(dropin_python.parent / "accelerate"), "env"], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("acc env") and "acc 0.1.0 at Accelerate's API level 1.15.0" in proc.stdout
