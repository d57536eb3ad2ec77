"""A griffe extension for the API reference (mkdocs.yml: mkdocstrings' `extensions`): docstrings whose Sphinx field
list (`:param x:`, `:return:`) is followed by more prose, as the hook specs' are (`**Kind**`, `**Called by**`,
`**Default**` after the fields).

Sphinx reads a field list as the docstring's end, so griffe's parser folds everything after it into the last field
(the hook's kind would show as part of what it returns). This moves that prose above the fields, each
`**Name**: ...` line as an item of a list (Markdown would run them together into one paragraph). The docstrings in
core/ are left as they are: only what the site renders changes.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

FIELD = re.compile(r"^:(param|parameter|arg|argument|key|keyword|type|returns?|rtype|raises?|except|yields?)\b")
LABEL = re.compile(r"^\*\*[^*]+\*\*:")


def reorder(text: str) -> str:
    """The docstring with the prose after its field list moved before it (unchanged when there is none)."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if FIELD.match(line)), None)
    if start is None:
        return text
    end = start
    while end < len(lines):
        if not lines[end].strip():
            following = next((line for line in lines[end:] if line.strip()), None)
            if following is not None and not FIELD.match(following) and not following.startswith(" "):
                break
        end += 1
    after = lines[end:]
    if not any(line.strip() for line in after):
        return text
    prose = []
    for line in after:
        if LABEL.match(line):
            prose.append("- " + line)
        elif line.strip() and prose and prose[-1].startswith(("- ", "  ")) and not line.startswith(" "):
            prose.append("  " + line)
        else:
            prose.append(line)
    fields = lines[start:end]
    return "\n".join([*lines[:start], *[line for line in prose], "", *fields]).strip("\n")


class FieldsLast(Extension):
    """Applies `reorder` to every function's docstring."""

    def on_function(self, *, func: Any, **kwargs: Any) -> None:
        if func.docstring is not None:
            func.docstring.value = reorder(func.docstring.value)
