"""The repo's plugins use acc only through its public contracts: a backend or cross-cutting plugin (entry-point
groups acc.backends / acc.plugins) imports `acc.backend` and nothing else of acc; a tracker (acc.trackers) imports
`acc.tracking`; a cluster environment (acc.clusters) `acc.cluster`. The rest of the kernel can change without breaking them (the backend template is held to it too)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

ALLOWED = {"acc.backends": {"acc.backend"}, "acc.plugins": {"acc.backend"}, "acc.trackers": {"acc.tracking"},
           "acc.clusters": {"acc.cluster"},
           # the `accelerate` drop-in (no entry points: it is acc under Accelerate's import name) forwards to acc's
           # public face and reads which distribution it is from acc.compat.dropin
           "drop-in": {"acc", "acc.compat.dropin"}}


def _plugins() -> list[tuple[str, Path]]:
    found = []
    for pyproject in sorted((ROOT / "plugins").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        if project["name"] == "accelerate":
            found.append(("drop-in", pyproject.parent))
            continue
        (group,) = [g for g in project.get("entry-points", {}) if g in ALLOWED]
        found.append((group, pyproject.parent))
    return found


def acc_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) for every import of acc or an acc submodule; `from acc import x` counts as acc.x."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name == "acc" or a.name.startswith("acc.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "acc" or node.module.startswith("acc.")):
            if node.module == "acc":
                out += [(node.lineno, f"acc.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
    return out


def test_the_scan_sees_every_form_of_import():
    found = [m for _, m in acc_imports("import acc\nimport acc.plugins\nfrom acc import backend as sdk, settings\n"
                                       "from acc.launch import elastic_plan\nfrom . import local\n"
                                       "def f():\n    from acc.runtime.ops import x\n")]
    assert found == ["acc", "acc.plugins", "acc.backend", "acc.settings", "acc.launch", "acc.runtime.ops"]


@pytest.mark.parametrize("group,directory", _plugins(), ids=lambda v: v.name if isinstance(v, Path) else v)
def test_a_plugin_imports_only_its_public_contract(group, directory):
    bad = []
    for path in sorted(directory.rglob("*.py")):
        for line, module in acc_imports(path.read_text()):
            if module not in ALLOWED[group]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, f"{group} plugins may import only {sorted(ALLOWED[group])}:\n" + "\n".join(bad)


def test_every_first_party_backend_is_scanned():
    names = {d.name for g, d in _plugins() if g == "acc.backends"}
    assert {"ddp", "fsdp", "deepspeed", "xla", "mps"} <= names


def test_the_backend_template_imports_only_the_sdk():
    source = (ROOT / "core" / "templates" / "backend" / "acc_NAME" / "plugin.py.tmpl").read_text()
    source = source.replace("{{", "{").replace("}}", "}").replace("{hookspec_version}", "2")
    assert {m for _, m in acc_imports(source)} == {"acc.backend"}


def test_importing_the_sdk_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, acc.backend as sdk; sdk.Capabilities; sdk.hookimpl; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("setting,pg,fits,picked", [
    ("auto", "gloo", True, "p2p"), ("auto", "gloo", False, "native"), ("auto", "nccl", True, "native"),
    ("auto", None, True, "native"), ("native", "gloo", True, "native"), ("p2p", "nccl", True, "p2p"),
    ("all_to_all", "gloo", True, "all_to_all"),
])
def test_collectives_choice_is_p2p_only_for_auto_on_gloo_where_it_fits(setting, pg, fits, picked):
    from acc import backend as sdk

    assert sdk.collectives_choice(setting, pg, p2p_fits=fits) == picked
