"""`acc migrate`: what a script written for Hugging Face Accelerate needs to run on acc.

The scan and the name check are `acc.compat.migrate_scan`. This module adds the known behaviour differences
(`DIFFERENCES`: docs/guides/migrating-from-accelerate.md, "What behaves differently" and "Exact resume and skipping",
reported by pattern; see its comment for how to add one), the import rewrite (`--write`), the per-script report, and
the coverage of a corpus of scripts (`python -m acc.compat.migrate --coverage USAGE.json`).

Importing this module is cheap (standard library only); checking names imports acc's modules, and so torch.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from acc.compat.migrate_scan import (
    KINDS,
    ROOTS,
    Checker,
    Hit,
    MigrateError,
    Scan,
    Use,
    acc_module_candidates,
    acc_module_name,
    decode_source,
    display_name,
    guarded_by,
    parse_source,
    read_source,
    root_module,
    scan_file,
    scan_source,
)

# ------------------------------------------------------------------------------------------------- scanning


# ------------------------------------------------------------------------------------------------- checking


# ------------------------------------------------------------------------------------- behaviour differences

# Known behaviour differences, reported where a script's code matches. The docs page
# docs/guides/migrating-from-accelerate.md ("What behaves differently", "Exact resume and skipping") is the source of
# truth: every entry quotes it in "readme" (the key's name is older than the page; tests/core/test_migrate.py checks
# the quote is still there), and "message" says only what the page says.
#
# To add one: append a dict with
#   id        short name (shown in the report)
#   readme    a phrase of the docs page's entry it encodes (whitespace is not significant)
#   match     a list of patterns; the entry is reported on every line one of them matches
#   requires  (optional) patterns that must each match somewhere in the script
#   unless    (optional) patterns none of which may match anywhere in the script
#   message   what to tell the user
# A pattern is a one-key dict; the keys are the matchers of PATTERNS below:
#   {"method": "load_state"}            accelerator.load_state(...) (a call on an Accelerator object)
#   {"call": "set_epoch"}               any call of that name: x.set_epoch(...), set_epoch(...)
#   {"prepares": REGEX}                 an argument of accelerator.prepare / prepare_scheduler named like REGEX
#   {"use": REGEX}                      a scanned name (as displayed) matching REGEX
#   {"keyword": {"name": "split_batches", "value": True}}   a keyword (with a literal value, optional) passed to
#                                       a callable imported from Accelerate or a method of an Accelerate object
#   {"unguarded_method": {"method": M, "guard": G}}   accelerator.M(...) not inside `if <... G ...>:`
#   {"scaled_by": {"factor": F, "where": REGEX}}      `... * accelerator.F` in a keyword argument or an assignment
#                                       whose name matches REGEX
#   {"skip_loop": REGEX}                `if step < resume_step: ... continue` (a name matching REGEX compared
#                                       with < or <=, in an `if` whose body continues the loop)
DIFFERENCES: list[dict[str, Any]] = [
    {
        "id": "split-batches-ignored",
        "readme": "`Accelerator(split_batches=True)` is ignored as in 1.15",
        "match": [{"keyword": {"name": "split_batches", "value": True}}],
        "message": "Accelerator(split_batches=True) is ignored, as Accelerate 1.15 ignores it (acc warns): to split "
                   "batches pass dataloader_config=DataLoaderConfiguration(split_batches=True)",
    },
    {
        "id": "resume-skip-twice",
        "readme": "the data continue with\nthe next batch and the script must not skip",
        "match": [{"skip_loop": r"(?i)resume|skip"}, {"call": "skip_first_batches"}],
        "requires": [{"method": "load_state"}, {"keyword": {"name": "use_stateful_dataloader", "value": True}}],
        "message": "with use_stateful_dataloader=True acc's load_state continues the data loaders at the saved batch "
                   "(exact resume, no torchdata needed), so skipping the batches already trained here skips them "
                   "a second time: remove the skip",
    },
    {
        "id": "reduce-scale",
        "readme": "`reduce(scale=)` applies only on XLA",
        "match": [{"keyword": {"name": "scale"}}],
        "requires": [{"method": "reduce"}],
        "message": "reduce(scale=...) is applied on XLA only, as Accelerate documents (acc warns elsewhere): "
                   "multiply the result instead",
    },
    {
        "id": "checkpoints",
        "readme": "**Checkpoints never run code**",
        "match": [{"method": "load_state"}],
        "message": "acc's load_state reads acc checkpoints (safetensors and a manifest); a checkpoint written by "
                   "Accelerate's save_state is not loaded (its pickled RNG-state files are refused): load its "
                   "model weights with load_checkpoint_and_dispatch or load_state_dict instead",
    },
    {
        "id": "gather-object",
        "readme": "**gather_object** of an object that is not a list returns each process's object",
        "match": [{"call": "gather_object"}],
        "message": "gather_object of an object that is not a list returns each process's object; Accelerate 1.15 "
                   "iterates it (a dict gives its keys, a string its characters): lists behave the same",
    },
    {
        "id": "deepspeed-clipping",
        "readme": "**DeepSpeed does not clip unless asked**",
        "match": [{"use": r"(?i)deepspeed"}],
        "unless": [{"method": "clip_grad_norm_"}],
        "message": "on DeepSpeed acc does not clip unless asked (it writes gradient_clipping: 0; DeepSpeed clips "
                   "to norm 1.0 when its config is silent): pass --gradient-clipping or call clip_grad_norm_",
    },
]


def _calls(scan: Scan) -> Iterator[ast.Call]:
    for node in ast.walk(scan.tree):
        if isinstance(node, ast.Call):
            yield node


def _method_calls(scan: Scan, method: str) -> Iterator[ast.Call]:
    for node in _calls(scan):
        if (isinstance(node.func, ast.Attribute) and node.func.attr == method
                and scan.owners(node.func.value) == "Accelerator"):
            yield node


def _m_method(scan: Scan, method: str) -> list[int]:
    return [n.lineno for n in _method_calls(scan, method)]


def _m_call(scan: Scan, name: str) -> list[int]:
    return [n.lineno for n in _calls(scan)
            if (isinstance(n.func, ast.Attribute) and n.func.attr == name)
            or (isinstance(n.func, ast.Name) and n.func.id == name)]


def _terminal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _m_prepares(scan: Scan, pattern: str) -> list[int]:
    regex = re.compile(pattern)
    lines = []
    for method in ("prepare", "prepare_scheduler"):
        for call in _method_calls(scan, method):
            args = [a.value if isinstance(a, ast.Starred) else a for a in call.args]
            if any((name := _terminal(a)) is not None and regex.search(name) for a in args):
                lines.append(call.lineno)
    return lines


def _m_use(scan: Scan, pattern: str) -> list[int]:
    regex = re.compile(pattern)
    return [u.line for u in scan.uses if regex.search(u.display)]


def _m_keyword(scan: Scan, spec: dict[str, Any]) -> list[int]:
    wanted = f"({spec['name']}=)"
    lines = {u.line for u in scan.uses if u.kind in ("keyword", "method_keyword") and u.name.endswith(wanted)}
    if "value" not in spec:
        return sorted(lines)
    out = []
    for call in _calls(scan):
        if call.lineno in lines:
            for kw in call.keywords:
                if (kw.arg == spec["name"] and isinstance(kw.value, ast.Constant)
                        and kw.value.value == spec["value"]):
                    out.append(call.lineno)
    return out


def _m_unguarded_method(scan: Scan, spec: dict[str, Any]) -> list[int]:
    guard = re.compile(rf"\b{re.escape(spec['guard'])}\b")
    return [c.lineno for c in _method_calls(scan, spec["method"]) if not guarded_by(c, scan.parents, guard)]


def _m_scaled_by(scan: Scan, spec: dict[str, Any]) -> list[int]:
    where = re.compile(spec["where"])
    lines = []
    for node in ast.walk(scan.tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        if not any(isinstance(side, ast.Attribute) and side.attr == spec["factor"]
                   and scan.owners(side.value) == "Accelerator" for side in (node.left, node.right)):
            continue
        parent = scan.parents.get(node)
        while parent is not None and not isinstance(parent, (ast.stmt, ast.keyword)):
            parent = scan.parents.get(parent)
        names: list[str] = []
        if isinstance(parent, ast.keyword) and parent.arg:
            names = [parent.arg]
        elif isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            names = [n for t in targets for n in [_terminal(t)] if n]
        if any(where.search(n) for n in names):
            lines.append(node.lineno)
    return lines


def _m_skip_loop(scan: Scan, pattern: str) -> list[int]:
    regex = re.compile(pattern)
    lines = []
    for node in ast.walk(scan.tree):
        if not isinstance(node, ast.If):
            continue
        compares = [c for c in ast.walk(node.test) if isinstance(c, ast.Compare)
                    and any(isinstance(op, (ast.Lt, ast.LtE)) for op in c.ops)]
        if not any(regex.search(name) for c in compares for part in [c.left, *c.comparators]
                   for name in [_terminal(part)] if name):
            continue
        if any(isinstance(s, ast.Continue) for stmt in node.body for s in ast.walk(stmt)):
            lines.append(node.lineno)
    return lines


PATTERNS: dict[str, Callable[[Scan, Any], list[int]]] = {
    "method": _m_method,
    "call": _m_call,
    "prepares": _m_prepares,
    "use": _m_use,
    "keyword": _m_keyword,
    "unguarded_method": _m_unguarded_method,
    "scaled_by": _m_scaled_by,
    "skip_loop": _m_skip_loop,
}


def _match(scan: Scan, pattern: dict[str, Any]) -> list[int]:
    (kind, arg), = pattern.items()
    return PATTERNS[kind](scan, arg)


def differences(scan: Scan, table: list[dict[str, Any]] | None = None) -> list[Hit]:
    """The known behaviour differences `scan`'s script runs into, by line."""
    hits = []
    for entry in DIFFERENCES if table is None else table:
        if not all(_match(scan, p) for p in entry.get("requires", [])):
            continue
        if any(_match(scan, p) for p in entry.get("unless", [])):
            continue
        lines = sorted({line for p in entry["match"] for line in _match(scan, p)})
        hits.extend(Hit(line, entry["id"], entry["message"]) for line in lines)
    return sorted(hits, key=lambda h: (h.line, h.id))


# ------------------------------------------------------------------------------------------------- rewriting


@dataclass
class Change:
    line: int
    before: str
    after: str


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for m in re.finditer(r"\r\n|\r|\n", text):
        starts.append(m.end())
    return starts


def rewrite_imports(text: str, label: str = "<script>") -> tuple[str, list[Change], list[str]]:
    """`text` with its Accelerate imports changed to acc's, and `accelerate.__version__` to the Accelerate
    release acc follows (`__accelerate_version__`: a version check then asks about the API the script meets);
    nothing else changed. Returns the text, the changed lines and notes about imports left unchanged."""
    tree = parse_source(text, label)
    starts = _line_starts(text)

    def offset(line: int, col: int) -> int:  # ast columns count UTF-8 bytes
        start = starts[line - 1]
        end = starts[line] if line < len(starts) else len(text)
        return start + len(text[start:end].encode("utf-8")[:col].decode("utf-8", errors="ignore"))

    used_names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used_names |= {n.value.id for n in ast.walk(tree)
                   if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    edits: list[tuple[int, int, str]] = []
    notes: list[str] = []
    imports_module = any(isinstance(n, ast.Import) and any(a.name == "accelerate" and not a.asname for a in n.names)
                         for n in ast.walk(tree))
    for node in ast.walk(tree):
        # `accelerate.__version__` asks which Accelerate API the script meets: acc's answer is the release it follows
        if imports_module and isinstance(node, ast.Attribute) and node.attr == "__version__" and \
                isinstance(node.value, ast.Name) and node.value.id == "accelerate":
            end = offset(node.end_lineno, node.end_col_offset)
            edits.append((end - len("__version__"), end, "__accelerate_version__"))
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "accelerate":
            for alias in node.names:
                if alias.name == "__version__":
                    begin = offset(alias.lineno, alias.col_offset)
                    edits.append((begin, begin + len("__version__"),
                                  "__accelerate_version__" + ("" if alias.asname else " as __version__")))
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and root_module(node.module) == "accelerate":
            begin = offset(node.lineno, node.col_offset)
            m = re.compile(r"from(?:\s|\\\r?\n)+([A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*)").match(text, begin)
            if m is None:  # pragma: no cover - ast and the regex disagree about an import statement
                notes.append(f"line {node.lineno}: could not find the module name; left unchanged")
                continue
            edits.append((m.start(1), m.end(1), acc_module_name(node.module)))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if root_module(alias.name) != "accelerate":
                    continue
                new = acc_module_name(alias.name)
                if alias.asname:
                    replacement = f"{new} as {alias.asname}"
                elif alias.name == "accelerate":
                    replacement = "acc as accelerate" if "accelerate" in used_names else "acc"
                elif "accelerate" not in used_names:
                    replacement = new
                elif new.split(".", 1)[1] == alias.name.split(".", 1)[1]:
                    replacement = f"{new}, acc as accelerate"  # accelerate.utils.X keeps working
                else:
                    notes.append(f"line {alias.lineno}: `import {alias.name}` left unchanged: acc names it {new}, "
                                 f"so the code's `{alias.name}.` must change too")
                    continue
                edits.append((offset(alias.lineno, alias.col_offset),
                              offset(alias.end_lineno, alias.end_col_offset), replacement))
    if not edits:
        return text, [], notes
    new_text = text
    for begin, end, replacement in sorted(edits, reverse=True):
        new_text = new_text[:begin] + replacement + new_text[end:]
    changes = _changed_lines(text, new_text, sorted(edits))
    return new_text, changes, notes


def _changed_lines(old: str, new: str, edits: list[tuple[int, int, str]]) -> list[Change]:
    old_lines = re.split(r"\r\n|\r|\n", old)
    new_lines = re.split(r"\r\n|\r|\n", new)
    starts = _line_starts(old)
    lines = sorted({max(i for i, s in enumerate(starts) if s <= begin) for begin, _, _ in edits})
    # edits never add or remove line breaks, so line numbers agree between old and new
    return [Change(i + 1, old_lines[i].strip(), new_lines[i].strip()) for i in lines]


# ------------------------------------------------------------------------------------------------- reports


@dataclass
class Report:
    path: str
    scan: Scan
    missing: list[Use]
    hits: list[Hit]
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def use(u: Use) -> dict[str, Any]:
            return {"line": u.line, "kind": u.kind, "name": u.display, "test_only": u.test_only}

        return {
            "path": self.path,
            "training_script": self.scan.training_script,
            "uses": [use(u) for u in self.scan.uses],
            "missing": [use(u) for u in self.missing],
            "differences": [{"line": h.line, "id": h.id, "message": h.message} for h in self.hits],
            "rewritten": [{"line": c.line, "before": c.before, "after": c.after} for c in self.changes],
            "notes": self.notes,
        }


def check_file(path: str | Path, checker: Checker | None = None) -> Report:
    scan = scan_file(path)
    checker = checker or Checker()
    return Report(str(path), scan, checker.missing(scan.uses), differences(scan))


def format_report(report: Report) -> str:
    rows = [(u.line, "missing", u.kind, u.display + ("  (test-only)" if u.test_only else "")) for u in report.missing]
    rows += [(h.line, "differs", h.id, h.message) for h in report.hits]
    names = {(u.kind, u.name) for u in report.scan.uses}
    missing = {(u.kind, u.name) for u in report.missing}
    if missing:
        head = f"{report.path}: {len(missing)} of the {len(names)} Accelerate names it uses are missing in acc"
    elif names:
        head = f"{report.path}: every Accelerate name it uses exists in acc ({len(names)} names)"
    else:
        head = f"{report.path}: uses no Accelerate name"
    if report.hits:
        head += f"; {len(report.hits)} known difference(s)"
    width = max([len(str(r[0])) for r in rows], default=1)
    lines = [head] + [f"  {path_line(report.path, line, width)}  {what:<8} {kind:<16} {text}"
                      for line, what, kind, text in sorted(rows, key=lambda r: (r[0], r[1] != "missing"))]
    return "\n".join(lines)


def path_line(path: str, line: int, width: int) -> str:
    return f"{path}:{str(line).ljust(width)}"


# ------------------------------------------------------------------------------------------------- coverage

TARGET_PERCENT = 95.0  # what migration should reach: training scripts per corpus that run after the import change


def load_usage(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise MigrateError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MigrateError(f"{path}: not a usage file (invalid JSON: {exc})") from None


def coverage(data: dict[str, Any], checker: Checker | None = None) -> list[dict[str, Any]]:
    """Per corpus of a usage file (tests/data/accelerate_usage.json): the training scripts none of whose names is
    missing in the installed acc, and how many files use each missing name (names whose absence follows from
    another's are not counted, see `Checker.missing`). Test-only names are not counted."""
    checker = checker or Checker()
    results = []
    for corpus in data["corpora"]:
        files = corpus["files"]
        training = [f for f in files if f["training_script"]]
        clean, missing_by_file = [], {}
        distinct: set[tuple[str, str]] = set()
        for f in files:
            names = {(kind, name) for kind, name in f["uses"]}
            distinct |= names
            missing = {n for n in names if not checker.present(*n)}
            missing_by_file[f["path"]] = sorted(n for n in missing if not checker.implied(*n, missing))
            if f["training_script"] and not missing:
                clean.append(f["path"])
        # keyed by the displayed name: `accelerate.state.is_initialized` is one name whether the script wrote
        # `from accelerate.state import is_initialized` or `accelerate.state.is_initialized()`
        counts: Counter = Counter(n for m in missing_by_file.values() for n in {display_name(*k) for k in m})
        training_counts: Counter = Counter(n for f in training
                                           for n in {display_name(*k) for k in missing_by_file[f["path"]]})
        present = {n for n in distinct if checker.present(*n)}
        results.append({
            "name": corpus["name"], "repository": corpus["repository"], "commit": corpus["commit"],
            "files": len(files), "training_scripts": len(training), "clean_training_scripts": clean,
            "percent": 100.0 * len(clean) / len(training) if training else 100.0,
            "distinct_names": len(distinct), "distinct_present": len(present),
            "missing": counts, "missing_in_training": training_counts,
        })
    return results


def format_coverage(results: list[dict[str, Any]], top: int = 30) -> str:
    lines = [f"Training scripts (files calling accelerator.prepare / prepare_model) whose every Accelerate name exists "
             f"in acc; target {TARGET_PERCENT:g} %", ""]
    header = ("corpus", "commit", "clean / training scripts", "files", "distinct names present")
    table = [header] + [(r["name"], r["commit"][:8],
                         f"{len(r['clean_training_scripts'])} / {r['training_scripts']} ({r['percent']:.1f} %)",
                         str(r["files"]), f"{r['distinct_present']} / {r['distinct_names']}") for r in results]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    for r in results:
        if r["clean_training_scripts"]:
            lines.append(f"  {r['name']}: clean: {', '.join(r['clean_training_scripts'])}")
    total: Counter = Counter()
    for r in results:
        total.update(r["missing"])
    lines += ["", f"Most used missing names (files using each; {len(total)} distinct missing names in all)"]
    header = ("rank", "name", *(r["name"] for r in results), "total")
    table = [header] + [(str(i), name, *(str(r["missing"].get(name, 0)) for r in results), str(n))
                        for i, (name, n) in enumerate(sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:top], 1)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m acc.compat.migrate --coverage USAGE.json` prints the coverage table; `python -m acc.compat.migrate SCRIPT...`
    checks scripts (as `acc migrate`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m acc.compat.migrate", description=main.__doc__)
    parser.add_argument("scripts", nargs="*")
    parser.add_argument("--coverage", metavar="USAGE_JSON", help="print the coverage table of a usage file")
    parser.add_argument("--top", type=int, default=30, help="how many missing names to list (default 30)")
    args = parser.parse_args(argv)
    try:
        if args.coverage:
            print(format_coverage(coverage(load_usage(args.coverage)), top=args.top))
            return 0
        if not args.scripts:
            parser.error("give SCRIPT... or --coverage USAGE_JSON")
        checker = Checker()
        reports = [check_file(p, checker) for p in args.scripts]
    except MigrateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for report in reports:
        print(format_report(report))
    return 1 if any(r.missing for r in reports) else 0


# the scan's names are handed on, so `acc.compat.migrate` is the whole of `acc migrate`'s API
__all__ = ["DIFFERENCES", "KINDS", "PATTERNS", "ROOTS", "Change", "Checker", "Hit", "MigrateError", "Report", "Scan",
           "Use", "acc_module_candidates", "acc_module_name", "check_file", "coverage", "decode_source", "differences",
           "display_name", "format_coverage", "format_report", "load_usage", "main", "parse_source", "read_source",
           "rewrite_imports", "scan_file", "scan_source"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
