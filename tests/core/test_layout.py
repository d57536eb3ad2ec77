"""acc's layout, held by tests: the top level of `acc` is its public face, everything else lives in packages named for
their role, the import-layer contract in pyproject.toml ([tool.importlinter], checked with import-linter) holds, no
module imports itself around a cycle, and every public name of acc 0.1 still imports from the path it had."""

from __future__ import annotations

import ast
import importlib
import json
import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from tests.conftest import ROOT

CORE = ROOT / "core"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# The public import paths that may be files at the top of `acc`: Accelerate's module map (what `import acc as
# accelerate` scripts import) and acc's own SDKs and faces. Packages (directories) are public faces too where they
# are in PUBLIC_PACKAGES; every other package is a role package.
PUBLIC_FILES = {
    "__init__.py", "__main__.py",
    # Accelerate's module map
    "accelerator.py", "state.py", "data_loader.py", "big_modeling.py", "hooks.py", "launchers.py", "local_sgd.py",
    "logging.py", "optimizer.py", "scheduler.py", "checkpointing.py", "inference.py", "parallelism_config.py",
    # acc's own SDKs and faces
    "backend.py", "cluster.py", "errors.py",
}
PUBLIC_PACKAGES = {"utils", "commands", "test_utils", "tracking", "big_model", "checkpointing", "testing", "cli"}
ROLE_PACKAGES = {"contract", "assembly", "compat", "launcher", "runtime", "builtin"}
NOT_CODE = {"templates"}


def test_the_top_level_of_acc_holds_only_public_import_paths():
    files = {p.name for p in CORE.iterdir() if p.is_file() and p.suffix == ".py"}
    assert files <= PUBLIC_FILES, f"top-level files that are no public import path: {sorted(files - PUBLIC_FILES)}"
    packages = {p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    unknown = packages - PUBLIC_PACKAGES - ROLE_PACKAGES - NOT_CODE
    assert not unknown, f"packages that are neither a public face nor a known role: {sorted(unknown)}"


def _packages() -> list[Path]:
    return sorted(p.parent for p in CORE.rglob("__init__.py") if "templates" not in p.parts)


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(CORE)) or "acc")
def test_every_package_says_what_it_holds_and_what_it_may_import(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    assert len(doc.split()) >= 20, f"{package}: the package docstring says what the package holds"
    prose = [line for line in doc.splitlines() if not line.startswith("    ") and not line.lstrip().startswith(("from ", "import "))]
    assert any("import" in line.lower() for line in prose), f"{package}: the package docstring says what it may import"


def test_no_module_is_over_600_lines():
    long = [f"{p.relative_to(ROOT)}: {n}" for p in sorted([*CORE.rglob("*.py"), *(ROOT / "plugins").rglob("*.py")])
            if (n := len(p.read_text().splitlines())) > 600]
    assert not long, "modules over 600 lines:\n" + "\n".join(long)


def test_pyproject_lists_every_package_of_acc():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(("acc", *p.relative_to(CORE).parts)).rstrip(".") for p in _packages()}
    assert listed == on_disk, f"missing in pyproject.toml: {sorted(on_disk - listed)}; not on disk: {sorted(listed - on_disk)}"


# ---------------------------------------------------------------------------------------------- imports


def cycles(package: str, path: Path | None = None) -> list[list[str]]:
    """The import cycles among `package`'s modules (each a strongly connected set of two or more), counting lazy
    imports and TYPE_CHECKING imports, as grimp reads them."""
    import grimp

    saved = list(sys.path)
    if path is not None:
        sys.path.insert(0, str(path))
    try:
        graph = grimp.build_graph(package, cache_dir=None)
    finally:
        sys.path[:] = saved
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other.split(".")[0] != package:
                continue
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module.split(".")[0] == package and module not in index:
            visit(module)
    return found


def test_import_cycles_among_accs_modules_are_zero():
    assert cycles("acc") == []


def test_the_cycle_count_sees_a_lazy_import_cycle(tmp_path):
    pkg = tmp_path / "loopy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from loopy import b\n")
    (pkg / "b.py").write_text("def f():\n    from loopy import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from loopy import a\n")
    (pkg / "d.py").write_text("from loopy import a\n")
    assert cycles("loopy", tmp_path) == [["loopy.a", "loopy.b", "loopy.c"]]


def _lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = None
    if pythonpath is not None:
        import os

        env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_import_layer_contract_holds():
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 2 kept, 0 broken." in proc.stdout, proc.stdout


@pytest.mark.parametrize("module,line,broken", [
    # the contract imports the worker runtime: an upward edge, and torch with it
    ("contract/enums.py", "from acc.runtime import ops", "acc.contract is not allowed to import acc.runtime"),
    # the worker runtime imports a face, lazily
    ("runtime/seeding.py", "def _f():\n    from acc.accelerator import Accelerator\n",
     "acc.runtime is not allowed to import acc.accelerator"),
    # two independent siblings
    ("tracking/values.py", "from acc.big_model import sizes", "acc.tracking is not allowed to import acc.big_model"),
])
def test_an_upward_import_breaks_the_contract(tmp_path, module, line, broken):
    copy = tmp_path / "acc"
    shutil.copytree(CORE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(copy / module, "a") as f:
        f.write(f"\n{line}\n")
    proc = _lint_imports(tmp_path, pythonpath=tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert broken in proc.stdout, proc.stdout


def test_the_contract_assembly_compat_and_launcher_import_without_torch():
    modules = sorted(".".join(("acc", *p.relative_to(CORE).with_suffix("").parts)).removesuffix(".__init__")
                     for d in ("contract", "assembly", "compat", "launcher") for p in (CORE / d).rglob("*.py"))
    code = (f"import sys\nfor m in {modules!r}:\n    __import__(m)\n"
            "print([m for m in sys.modules if m == 'torch' or m.startswith('torch.')][:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


# ---------------------------------------------------------------------------------------------- public names


def _previous_names() -> dict[str, list[str]]:
    return json.loads((ROOT / "tests" / "data" / "public_names_0.1.json").read_text())["modules"]


@pytest.mark.parametrize("module", sorted(_previous_names()))
def test_every_public_name_of_acc_0_1_still_imports_from_its_path(module):
    missing = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # acc 0.1's SDK paths warn, and work
        loaded = importlib.import_module(module)
        for name in _previous_names()[module]:
            try:
                getattr(loaded, name)
            except (AttributeError, ImportError) as exc:
                missing.append(f"{module}.{name}: {exc}")
            try:
                exec(f"from {module} import {name}", {})
            except ImportError as exc:
                missing.append(f"from {module} import {name}: {exc}")
    assert not missing, "\n".join(missing)


def test_acc_0_1s_module_paths_warn_and_hand_out_the_same_objects():
    from acc.contract.settings import Setting
    from acc.launcher.plans import elastic_plan

    with pytest.warns(DeprecationWarning, match=r"acc\.launch\.elastic_plan is acc 0\.1's path"):
        from acc.launch import elastic_plan as old
    assert old is elastic_plan
    with pytest.warns(DeprecationWarning, match="acc.settings.Setting"):
        from acc.settings import Setting as old_setting
    assert old_setting is Setting
    import acc

    assert callable(acc.launch) and acc.launch.__module__ == "acc.launcher.functions"  # the function, not a module
