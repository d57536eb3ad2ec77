"""The documentation: the site builds with `mkdocs build --strict` (mkdocs.yml, in the docs venv that
scripts/docs-venv.sh builds and caches), a broken link or anchor fails it, every relative link of README.md and
docs/ points at a file (and heading) that exists, the README stays short and keeps the test command CI runs, and
the generated settings page lists every kernel setting."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from acc.assembly.settings import core_settings
from tests.conftest import ROOT, clean_env
from tests.docs import links

VENV_SCRIPT = ROOT / "scripts" / "docs-venv.sh"
DOCS = ROOT / "docs"
README = ROOT / "README.md"
# mkdocs built from a config file and a docs directory given apart (the strict build of a changed copy of docs/)
BUILD = """\
import logging
import sys
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort
logging.basicConfig(level=logging.WARNING, format="%(levelname)s - %(message)s")
try:
    build(load_config(config_file=sys.argv[1], docs_dir=sys.argv[2], site_dir=sys.argv[3], strict=True))
except Abort as exc:
    print(exc, file=sys.stderr)
    sys.exit(1)
"""


def docs_env(tmp_path: Path) -> dict[str, str]:
    return clean_env(tmp_path, NO_MKDOCS_2_WARNING="1")


@pytest.fixture(scope="session")
def docs_python() -> Path:
    """The docs venv's python (built once, cached under ~/.cache/acc); a failed build fails, never skips."""
    start = time.monotonic()
    proc = subprocess.run([str(VENV_SCRIPT)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{VENV_SCRIPT} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    print(f"\ndocs venv ready in {time.monotonic() - start:.1f} s")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def site(docs_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built from the repository with `mkdocs build --strict`."""
    tmp = tmp_path_factory.mktemp("docs")
    out = tmp / "site"
    start = time.monotonic()
    proc = subprocess.run([str(docs_python), "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
                          env=docs_env(tmp), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mkdocs build --strict failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
    print(f"mkdocs build --strict: {time.monotonic() - start:.1f} s")
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


# ------------------------------------------------------------------------------------------------ the build


@pytest.mark.slow
def test_the_site_builds_strict_with_every_page(site):
    for name in ("index.html", "getting-started/index.html", "concepts/architecture/index.html",
                 "guides/migrating-from-accelerate/index.html", "security/index.html", "benchmarks/index.html"):
        assert (site / name).is_file(), name
    # nothing of the build's own machinery is published
    assert not (site / "hooks").exists()


@pytest.mark.slow
def test_the_reference_pages_are_generated_from_the_code(site):
    accelerator = text_of(page(site, "reference/accelerator"))
    for name in ("acc.accelerator.Accelerator", "prepare", "gather_for_metrics", "save_state", "init_module"):
        assert name in accelerator, name
    sdk = text_of(page(site, "reference/backend-sdk"))
    for name in ("Capabilities", "Communicator", "RunContext", "device_problems", "collectives_choice"):
        assert name in sdk, name
    hooks = text_of(page(site, "reference/hookspecs"))
    for name in ("acc_add_settings", "acc_launch_plan", "acc_communicator", "acc_wrap", "acc_cluster_environment"):
        assert name in hooks, name
    # a hook's kind is shown as such, not as part of what it returns (docs/hooks/griffe_docstrings.py)
    assert re.search(r"Kind</strong>: selection", page(site, "reference/hookspecs"))
    cli = page(site, "reference/cli")
    for command in ("acc launch", "acc check", "acc config", "acc plugins", "acc merge-weights", "acc migrate"):
        assert command in cli, command
    assert "--dry-run" in cli
    assert "Sentinel" not in cli  # click's "no default" marker is shown as what it means


@pytest.mark.slow
def test_the_settings_page_lists_every_kernel_setting(site):
    html = page(site, "reference/settings")
    for setting in core_settings():
        assert f"<code>{setting.name}</code>" in html, setting.name
        assert f"<code>{setting.env_var}</code>" in html, setting.env_var
        for flag in setting.flags:
            assert f"<code>{flag}</code>" in html, flag
    # and the first-party backends' (installed editable in the docs venv)
    for name in ("process_group_backend", "fsdp_strategy", "zero_stage", "mps_fallback"):
        assert f"<code>{name}</code>" in html, name
    concepts = page(site, "concepts/settings")
    for setting in core_settings():
        assert f"<code>{setting.name}</code>" in concepts, setting.name


@pytest.mark.slow
def test_the_benchmarks_page_holds_the_generated_tables(site):
    html = page(site, "benchmarks")
    for stem in ("results", "quick"):  # ./scripts/bench.sh's table and ./scripts/bench.sh --quick's
        results = (ROOT / "bench" / "results" / f"{stem}.md").read_text()
        rows = [line for line in results.splitlines() if line.startswith("| ") and "---" not in line
                and "benchmark" not in line]
        assert rows, stem
        assert "<table>" in html and rows[0].split("|")[1].strip() in html, stem
    assert "Reading it" in html


@pytest.mark.slow
def test_a_broken_link_or_anchor_fails_the_strict_build(docs_python, tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    target = docs / "guides" / "checkpoints.md"
    target.write_text(target.read_text() + "\n[gone](no-such-page.md) and [lost](tracking.md#no-such-heading)\n")
    proc = subprocess.run([str(docs_python), "-c", BUILD, str(ROOT / "mkdocs.yml"), str(docs), str(tmp_path / "site")],
                          cwd=ROOT, env=docs_env(tmp_path), capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "no-such-page.md" in output and "no-such-heading" in output, output
    # and the offline check finds them too
    problems = links.check([target], tmp_path, confine=docs)
    assert len(problems) == 2, problems


# ------------------------------------------------------------------------------------- offline: links, README


def markdown_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_every_relative_link_points_at_a_file_and_heading_that_exist():
    problems = links.check([README], ROOT) + links.check(markdown_files(), ROOT, confine=DOCS)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_readme_links_into_the_docs():
    targets = {target.split("#")[0] for _, target in links.links(README)}
    for name in ("docs/index.md", "docs/getting-started.md", "docs/guides/migrating-from-accelerate.md",
                 "docs/reference/settings.md", "docs/security.md", "docs/benchmarks.md"):
        assert name in targets, name


def test_the_link_checker_finds_what_is_broken(tmp_path):
    docs = tmp_path / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / "index.md").write_text("# Home\n\n## `acc check` and more\n\n## Same\n\n## Same\n")
    (docs / "guides" / "a.md").write_text(textwrap.dedent("""\
        # A

        [ok](../index.md) [ok](../index.md#acc-check-and-more) [ok](../index.md#same_1) [ok](#a) [web](https://x.y)
        [missing](b.md) [no heading](../index.md#nope) [outside](../../README.md) [absolute](/index.md)
        `[in code](nowhere.md)`

        ```
        [in a block](nowhere.md)
        ```
        """))
    problems = links.check([docs / "guides" / "a.md"], tmp_path, confine=docs)
    assert [re.search(r"link '([^']+)'", p).group(1) for p in problems] == [
        "b.md", "../index.md#nope", "../../README.md", "/index.md"], problems


def test_the_readme_is_short_and_keeps_the_set_up_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move sections into docs/ (at most 150)"
    # the command CI runs (.ci/run: `exec ./scripts/test.sh`) is the README's test command, and the main job's too
    commands = re.findall(r"^\s*(?:exec\s+)?(\./scripts/[\w.-]+)", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    assert commands == ["./scripts/test.sh"], commands
    for command in (*commands, "./scripts/demo.sh"):
        assert re.search(rf"^{re.escape(command)}\s", text, re.MULTILINE), f"README.md lost the command {command}"


# --------------------------------------------------------------------------------- the generator, without mkdocs


def load_generator():
    spec = importlib.util.spec_from_file_location("acc_docs_generate", DOCS / "hooks" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_generated_settings_reference_lists_every_kernel_setting():
    generate = load_generator()
    text = generate.settings_reference()
    for setting in core_settings():
        assert f"| `{setting.name}` |" in text, setting.name
    # every row has every column: name, type, default, flag, variable, config key, owner, choices, help
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows and all(len(re.split(r"(?<!\\)\|", row)) == 11 for row in rows), rows


def test_a_page_without_its_marker_or_with_an_unknown_one_fails():
    generate = load_generator()
    with pytest.raises(Exception, match="must hold the marker"):
        generate.expand("# Settings reference\n", "reference/settings.md")
    with pytest.raises(Exception, match="unknown marker"):
        generate.expand("<!-- acc:generate nothing-like-it -->\n", "index.md")
    assert generate.expand("no marker\n", "index.md") == "no marker\n"


def test_the_docs_venv_script_is_executable():
    assert os.access(VENV_SCRIPT, os.X_OK)
