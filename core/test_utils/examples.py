"""Accelerate's `accelerate.test_utils.examples`, for acc: checks that a `complete_*_example.py` script holds every
feature an `examples/by_feature/*.py` script adds to the plain NLP example.

`compare_against_test` is the check (it returns the feature's lines missing from the complete script);
`get_function_contents_by_name` and `clean_lines` are the steps it is built of. Paths are as Accelerate's tests
give them, relative to the working directory (the template is `examples/nlp_example.py`).
"""

from __future__ import annotations

import os

DATALOADER_LINE = "train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)\n"
MOCK_MARKER = "TESTING_MOCKED_DATALOADERS"
_ENDS = {"training_function": "def main", "main": "if __name__"}


def get_function_contents_by_name(lines: list[str], name: str) -> list[str]:
    """The lines of function `name` ("training_function" or "main") in `lines`: from its `def` up to the line that
    starts what follows it (`def main` after training_function, `if __name__` after main)."""
    if name not in _ENDS:
        raise ValueError(f"Incorrect function name passed: {name}, choose either 'main' or 'training_function'")
    body: list[str] = []
    inside = False
    for line in lines:
        if not inside:
            if f"def {name}" in line:
                inside = True
                body.append(line)
            continue
        if _ENDS[name] in line:
            break
        body.append(line)
    return body


def clean_lines(lines: list[str]) -> list[str]:
    """`lines` without comment lines and empty lines ("\\n")."""
    return [line for line in lines if line != "\n" and not line.lstrip().startswith("#")]


def _read(path: str | os.PathLike) -> list[str]:
    with open(path) as handle:
        return handle.readlines()


def _function(lines: list[str], parser_only: bool) -> list[str]:
    return clean_lines(get_function_contents_by_name(lines, "main" if parser_only else "training_function"))


def compare_against_test(base_filename: str | os.PathLike, feature_filename: str | os.PathLike, parser_only: bool,
                         secondary_filename: str | os.PathLike | None = None) -> list[str]:
    """The lines `feature_filename` adds to `examples/nlp_example.py` that `base_filename` (a complete example)
    lacks: an empty list when the complete example implements the feature.

    Compared are the `training_function` bodies, or the `main` bodies with `parser_only`; comments, blank lines,
    the data-loader line and the test-mode lines (`TESTING_MOCKED_DATALOADERS` and, in the feature script, the line
    after it) are not counted. With `secondary_filename` (the template of a complete example other than the NLP
    one, e.g. `examples/cv_example.py`) lines of nlp_example.py missing from that template are not counted either.
    """
    template_lines = _read(os.path.abspath(os.path.join("examples", "nlp_example.py")))
    template = _function(template_lines, parser_only)
    feature = _function(_read(feature_filename), parser_only)
    complete = _function(_read(base_filename), parser_only)

    def is_template(line: str) -> bool:
        return line in template or line.lstrip() == DATALOADER_LINE

    # the feature's own lines; its last line is not examined, and the line after a test-mode marker is skipped
    added: list[str] = []
    lines = iter(feature)
    for _ in range(len(feature) - 1):
        line = next(lines)
        if is_template(line):
            continue
        if MOCK_MARKER in line:
            next(lines)
            continue
        added.append(line)
    in_complete = [line for line in complete if not is_template(line) and MOCK_MARKER not in line]
    missing = [line for line in added if line not in in_complete]
    if secondary_filename is not None:
        secondary = _function(_read(secondary_filename), parser_only)
        not_in_secondary = [line for line in template_lines if line not in secondary]
        missing = [line for line in missing if line not in not_in_secondary]
    return missing


__all__ = ["clean_lines", "compare_against_test", "get_function_contents_by_name"]
