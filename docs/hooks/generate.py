"""The site's generated content, made at build time (mkdocs.yml `hooks:`) so that it cannot go stale.

A page asks for generated content with a marker line, replaced when the page is rendered:

    <!-- acc:generate settings-reference -->   every setting of the kernel and of each installed first-party plugin
    <!-- acc:generate kernel-settings -->      the kernel's settings, compact (concepts/settings.md)
    <!-- acc:generate benchmarks -->           bench/results/results.md, the table ./scripts/bench.sh writes
    <!-- acc:generate benchmarks-quick -->     bench/results/quick.md, the table ./scripts/bench.sh --quick writes

The settings come from the settings registry, as `acc launch` builds it: `acc.assembly.plugins.collect_settings` of a
plugin manager from `build_plugin_manager(backend, plugins)`, one manager per first-party backend and cross-cutting
plugin (the first-party ones are those declared in plugins/*/pyproject.toml). Torch-free: the build runs in the docs
venv (scripts/docs-venv.sh), which has no torch. An unknown marker, or a page that lost its marker, fails the build.
The functions below work without mkdocs too (tests/docs imports this file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ImportError:  # python < 3.11
    import tomli as tomllib

try:
    from mkdocs.exceptions import PluginError
except ImportError:  # imported by the tests, outside the docs venv
    PluginError = RuntimeError  # type: ignore[misc,assignment]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "results.md"
MARKER = re.compile(r"^<!--\s*acc:generate\s+(\S+)\s*-->[ \t]*$", re.MULTILINE)
# the pages that must carry a marker (a page that lost it would silently lose its generated content)
REQUIRED = {
    "reference/settings.md": "settings-reference",
    "concepts/settings.md": "kernel-settings",
    "benchmarks.md": "benchmarks",
}
GROUPS = {"acc.backends": "backend", "acc.plugins": "plugin"}


# ---------------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class FirstParty:
    """A first-party plugin of this repository, as its pyproject.toml declares it."""

    name: str
    kind: str  # backend | plugin
    distribution: str
    directory: str  # plugins/<directory>


def first_party(root: Path = ROOT) -> list[FirstParty]:
    """The backends and cross-cutting plugins that plugins/*/pyproject.toml declare (the template excluded)."""
    found = []
    for path in sorted((root / "plugins").glob("*/pyproject.toml")):
        if path.parent.name.startswith("_"):
            continue
        project = tomllib.loads(path.read_text()).get("project", {})
        for group, kind in GROUPS.items():
            for name in project.get("entry-points", {}).get(group, {}):
                found.append(FirstParty(name, kind, project.get("name", "?"), path.parent.name))
    return found


@dataclass
class Section:
    """The settings one owner declares."""

    owner: str
    title: str
    settings: list[Any]


def registry_sections(root: Path = ROOT) -> tuple[list[Section], list[FirstParty]]:
    """(the kernel's settings, then each installed first-party plugin's), and the first-party plugins that are not
    installed where the build runs. Each plugin's settings are read from the registry of a run that loads it."""
    from acc.assembly.plugins import (
        BUILTIN_BACKEND,
        build_plugin_manager,
        collect_settings,
        installed_backends,
        installed_plugins,
    )
    from acc.contract.settings import CORE_OWNER

    backends, plugins = installed_backends(), installed_plugins()
    runs: list[tuple[str, list[str], FirstParty | None]] = [(BUILTIN_BACKEND, [], None)]
    missing = []
    for plugin in first_party(root):
        installed = backends if plugin.kind == "backend" else plugins
        if plugin.name not in installed:
            missing.append(plugin)
        elif plugin.kind == "backend":
            runs.append((plugin.name, [], plugin))
        else:
            runs.append((BUILTIN_BACKEND, [plugin.name], plugin))
    sections: dict[str, Section] = {}
    seen: set[str] = set()
    for backend, extra, plugin in runs:
        registry = collect_settings(build_plugin_manager(backend, extra)[0])
        if plugin is not None and not registry.owned_by(plugin.name):
            sections.setdefault(plugin.name, Section(plugin.name, plugin.name, []))
        for setting in registry:
            if setting.name in seen:
                continue
            seen.add(setting.name)
            if setting.owner not in sections:
                if setting.owner == CORE_OWNER:
                    title = "The kernel (acc-core)"
                elif plugin is not None and plugin.name == setting.owner:
                    title = f"{plugin.name} ({plugin.kind}, {plugin.distribution}, plugins/{plugin.directory})"
                else:
                    title = setting.owner
                sections[setting.owner] = Section(setting.owner, title, [])
            sections[setting.owner].settings.append(setting)
    ordered = sorted(sections.values(), key=lambda s: (s.owner != CORE_OWNER, s.owner))
    return ordered, missing


def _text(value: str) -> str:
    """Prose for a table cell: Markdown's table and HTML characters escaped outside `code spans`."""
    parts = value.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = (parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                    .replace("*", "\\*"))
    return "`".join(parts).replace("|", "\\|").replace("\n", " ")


def _code(value: str) -> str:
    """A code span (Python-Markdown's tables do not split a row at a `|` inside one)."""
    return "`" + value + "`"


def _literal(value: Any) -> str:
    """A value as it is written in acc.toml."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return _code("true" if value else "false")
    if isinstance(value, str):
        return _code(f'"{value}"')
    if isinstance(value, (list, tuple)):
        return _code("[" + ", ".join(f'"{v}"' for v in value) + "]")
    return _code(repr(value))


def _default(setting: Any) -> str:
    text = _literal(setting.default)
    for preset, value in setting.presets or ():
        if value != setting.default:
            text += f" (semantics {preset}: {_literal(value)})"
    return text


def _kind(setting: Any) -> str:
    return "list of str" if setting.kind is list else setting.kind.__name__


def _choices(setting: Any) -> str:
    if setting.choices:
        return ", ".join(_code(c) for c in setting.choices)
    if setting.kind in (int, float) and (setting.minimum is not None or setting.maximum is not None):
        return _text(setting.describe_valid())
    return ""


def _flags(setting: Any) -> str:
    return ", ".join(_code(f) for f in setting.flags) or "(none)"


def _config_key(setting: Any) -> str:
    from acc.contract.settings import CORE_OWNER

    return _code(setting.key) if setting.owner == CORE_OWNER else _code(f"[{setting.owner}] {setting.key}")


def settings_reference(root: Path = ROOT) -> str:
    """Every setting of the registry: name, type, default, flag, environment variable, config-file key, owner,
    choices and help, a table per owner."""
    sections, missing = registry_sections(root)
    empty = [s.owner for s in sections if not s.settings]
    sections = [s for s in sections if s.settings]
    total = sum(len(s.settings) for s in sections)
    lines = [
        f"{total} settings: {len(sections[0].settings)} of the kernel and those of the first-party plugins installed "
        f"where this page was built ({', '.join(s.owner for s in sections[1:]) or 'none'}).",
        "",
    ]
    if empty:
        lines += [f"Installed first-party plugins that declare no setting of their own: {', '.join(empty)}. Cluster "
                  "environments (acc-clusters) declare none either: they are a source of settings' values "
                  "([Clusters](../guides/clusters.md)).", ""]
    if missing:
        lines += ["Not installed where this page was built, so not listed: "
                  + ", ".join(f"{p.name} ({p.distribution})" for p in missing)
                  + " (`acc launch --backend NAME --help` lists an installed plugin's settings).", ""]
    header = ["setting", "type", "default", "flag", "environment variable", "config file", "owner", "choices",
              "help"]
    for section in sections:
        lines += [f"## {section.title}", "", "| " + " | ".join(header) + " |",
                  "|" + "---|" * len(header)]
        for s in section.settings:
            cells = [_code(s.name), _kind(s), _default(s), _flags(s), _code(s.env_var), _config_key(s),
                     _code(s.owner), _choices(s), _text(s.help)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def kernel_settings(root: Path = ROOT) -> str:
    """The kernel's settings, compact: name, flag, default, help."""
    sections, _ = registry_sections(root)
    lines = ["| setting | flag | default | help |", "|---|---|---|---|"]
    for s in sections[0].settings:
        lines.append(f"| {_code(s.name)} | {_flags(s)} | {_default(s)} | {_text(s.help)} |")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------- benchmarks


def benchmarks(root: Path = ROOT, stem: str = "results") -> str:
    """bench/results/<stem>.md as ./scripts/bench.sh wrote it (its headings, if any, demoted below the page's)."""
    path = root / "bench" / "results" / f"{stem}.md"
    if not path.is_file():
        command = "./scripts/bench.sh" + (" --quick" if stem == "quick" else "")
        raise PluginError(f"{path} is missing: run {command}, or restore it")
    text = path.read_text()
    if "|---" not in text:
        raise PluginError(f"{path} holds no table")
    return re.sub(r"^(#{1,4}) ", r"#\1 ", text, flags=re.MULTILINE)


# ------------------------------------------------------------------------------------------------------- hooks

GENERATORS = {
    "settings-reference": settings_reference,
    "kernel-settings": kernel_settings,
    "benchmarks": benchmarks,
    "benchmarks-quick": lambda root: benchmarks(root, "quick"),
}


def generate(name: str, root: Path = ROOT) -> str:
    if name not in GENERATORS:
        raise PluginError(f"unknown marker 'acc:generate {name}'; known: {', '.join(GENERATORS)}")
    return GENERATORS[name](root)


def expand(markdown: str, page_path: str, root: Path = ROOT) -> str:
    """The page with each marker replaced by its generated content (`page_path` relative to docs/)."""
    want = REQUIRED.get(page_path)
    if want is not None and want not in MARKER.findall(markdown):
        raise PluginError(f"docs/{page_path} must hold the marker line '<!-- acc:generate {want} -->'")
    return MARKER.sub(lambda m: generate(m.group(1), root), markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown, Path(page.file.src_uri).as_posix())


_ROW = re.compile(r"<tr>.*?</tr>", re.S)


def click_defaults(html: str) -> str:
    """mkdocs-click 0.9 prints click 8.3's "no default" sentinel (`Sentinel.UNSET`) as an option's default: show
    what click does with such an option instead (a flag is off, any other option has no value)."""
    def row(match: re.Match[str]) -> str:
        text = match.group(0)
        if "<code>Sentinel.UNSET</code>" not in text:
            return text
        value = "<code>False</code>" if "<td>boolean</td>" in text else "None"
        return text.replace("<code>Sentinel.UNSET</code>", value)

    return _ROW.sub(row, html)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return click_defaults(html) if "Sentinel.UNSET" in html else html
