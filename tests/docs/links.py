"""An offline check of the relative links in Markdown files: every link to a file points at one that exists, and
every `#anchor` into a Markdown file at one of its headings (slugs as mkdocs' `toc` extension makes them, which
match GitHub's for the headings these pages use).

Used on README.md (links relative to the repository root: they work on GitHub) and on docs/**/*.md (links relative
to each page, which mkdocs also resolves; a page may not link outside docs/, which mkdocs could not publish).
Anchors into pages with generated content (`::: ` directives, `<!-- acc:generate ... -->` markers) are left to
`mkdocs build --strict`, which sees the generated headings.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

FENCE = re.compile(r"^(\s*)(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ATTR_ID = re.compile(r"\s*\{:?\s*#([\w-]+)[^}]*\}\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target): the target up to whitespace or the closing parenthesis
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*[\"'])?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_LINK = re.compile(r"""<(?:a|img)\s[^>]*?(?:href|src)=["']([^"']+)["']""")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
GENERATED = re.compile(r"^(::: |<!--\s*acc:generate\s)", re.MULTILINE)


def slugify(text: str) -> str:
    """Python-Markdown's `toc` slug of a heading's text (what mkdocs uses by default)."""
    text = CODE_SPAN.sub(lambda m: m.group(2), text)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("**", "").replace("__", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _lines_outside_code(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks and indented code blocks."""
    out = []
    fence: str | None = None
    previous_blank = True
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is not None:
            if match and match.group(2) == fence:
                fence = None
            previous_blank = False
            continue
        if match:
            fence = match.group(2)
            continue
        if previous_blank and line.startswith("    ") and not line.lstrip().startswith(("-", "*", "|")):
            continue  # an indented code block (not a continuation of a list item)
        previous_blank = not line.strip()
        out.append((number, line))
    return out


def anchors(path: Path) -> set[str]:
    """The ids of the headings of a Markdown file (`{#id}` where given, else the slug; duplicates get _1, _2...)."""
    found: set[str] = set()
    for _, line in _lines_outside_code(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        title = match.group(2)
        explicit = ATTR_ID.search(title)
        slug = explicit.group(1) if explicit else slugify(title)
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}_{n}"
        found.add(unique)
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image in a Markdown file, outside code."""
    found = []
    for number, line in _lines_outside_code(path.read_text()):
        line = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for pattern in (INLINE, REFERENCE, HTML_LINK):
            for match in pattern.finditer(line):
                found.append((number, match.group(1)))
    return found


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root.resolve())) if path.is_relative_to(root.resolve()) else str(path)


def check(files: list[Path], root: Path, confine: Path | None = None) -> list[str]:
    """Every broken relative link of `files`, as 'FILE:LINE: message' (paths shown relative to `root`).
    `confine`: a directory the links must stay inside (docs/ for the site's pages)."""
    problems = []
    cache: dict[Path, set[str]] = {}
    for path in files:
        shown = path.relative_to(root)
        for number, target in links(path):
            where = f"{shown}:{number}: link '{target}'"
            if EXTERNAL.match(target):
                continue
            if target.startswith("/"):
                problems.append(f"{where} is absolute: make it relative to the file")
                continue
            name, _, anchor = target.partition("#")
            name = unquote(name)
            destination = (path.parent / name).resolve() if name else path.resolve()
            if confine is not None and not destination.is_relative_to(confine.resolve()):
                problems.append(f"{where} points outside {confine.relative_to(root)}/, which the site cannot "
                                "publish: link inside it, or name the file as `code`")
                continue
            if not destination.exists():
                problems.append(f"{where}: {_shown(destination, root)} does not exist")
                continue
            if destination.is_dir():
                problems.append(f"{where} points at a directory: link a file in it")
                continue
            if anchor and destination.suffix == ".md":
                if GENERATED.search(destination.read_text()):
                    continue  # its generated headings are checked by mkdocs build --strict
                if destination not in cache:
                    cache[destination] = anchors(destination)
                if anchor not in cache[destination]:
                    problems.append(f"{where}: {destination.name} has no heading '#{anchor}' "
                                    f"(its headings: {', '.join(sorted(cache[destination]))})")
    return problems
