"""`acc migrate SCRIPT...`: the Accelerate names a script uses that acc lacks, the known behaviour differences it
runs into, and (`--write`) its Accelerate imports rewritten to acc's. Importing this module is torch-free; checking
names imports acc's modules (and torch)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from acc.errors import AccError


class MigrateInputError(AccError):
    """A script (or usage file) cannot be read or parsed."""


@click.command("migrate")
@click.argument("scripts", nargs=-1, metavar="SCRIPT...")
@click.option("--write", is_flag=True, help="Rewrite each script's Accelerate imports to acc's, in place (only the "
                                            "import lines change) and print what changed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the report.")
@click.option("--coverage", "usage", metavar="USAGE_JSON", type=click.Path(path_type=Path),
              help="Instead of scripts, print the coverage table of a usage file (tests/data/accelerate_usage.json): "
                   "per corpus, the training scripts none of whose names is missing in acc, and the most used "
                   "missing names.")
def migrate(scripts: tuple[str, ...], write: bool, as_json: bool, usage: Path | None) -> None:
    """Check scripts written for Hugging Face Accelerate against acc.

    Prints, by line, every Accelerate name a script uses that acc lacks (imports, attributes of the accelerator,
    keyword arguments of Accelerator(...) and of its methods), looked up in the installed acc, and every known
    behaviour difference its code runs into (docs/guides/migrating-from-accelerate.md, "What behaves
    differently").

    \b
    Exit status: 0 when no script uses a name acc lacks (differences alone do not fail),
                 1 when some name is missing,
                 2 when a script cannot be read or parsed (nothing is checked or written then).
    """
    from acc.compat import migrate as m

    if usage is not None:
        if scripts or write:
            raise MigrateInputError("--coverage takes a usage file only: give it without SCRIPT or --write")
        try:
            results = m.coverage(m.load_usage(usage))
        except m.MigrateError as exc:
            raise MigrateInputError(str(exc)) from None
        except (KeyError, TypeError, ValueError) as exc:
            raise MigrateInputError(f"{usage}: not a usage file (no {exc} in it)") from None
        if as_json:
            click.echo(json.dumps([{**r, "missing": _counts(r["missing"]),
                                    "missing_in_training": _counts(r["missing_in_training"])} for r in results],
                                  indent=2))
        else:
            click.echo(m.format_coverage(results))
        return
    if not scripts:
        raise click.UsageError("give at least one SCRIPT (or --coverage USAGE_JSON)")
    try:  # read and parse every script before checking or writing any
        sources = {path: m.read_source(path) for path in scripts}
        scans = {path: m.scan_source(text, path) for path, text in sources.items()}
    except m.MigrateError as exc:
        raise MigrateInputError(str(exc)) from None
    checker = m.Checker()
    reports = []
    for path, scan in scans.items():
        report = m.Report(path, scan, checker.missing(scan.uses), m.differences(scan))
        if write:
            new_text, report.changes, report.notes = m.rewrite_imports(sources[path], path)
            if report.changes:
                _write(Path(path), new_text)
        reports.append(report)
    if as_json:
        click.echo(json.dumps({"scripts": [r.as_dict() for r in reports],
                               "missing": sum(len(r.missing) for r in reports)}, indent=2))
    else:
        for report in reports:
            click.echo(m.format_report(report))
            if write:
                for change in report.changes:
                    click.echo(f"  {report.path}:{change.line}  rewrote  {change.before}  ->  {change.after}")
                for note in report.notes:
                    click.echo(f"  {report.path}: {note}")
                if not report.changes and not report.notes:
                    click.echo(f"  {report.path}: no Accelerate import to rewrite")
    raise click.exceptions.Exit(1 if any(r.missing for r in reports) else 0)


def _counts(counter) -> list[dict]:
    return [{"name": name, "files": n} for name, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))]


def _write(path: Path, text: str) -> None:
    """Write `text` back in the file's own encoding and line endings (`text` keeps them)."""
    import io
    import tokenize

    data = path.read_bytes()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    bom = data.startswith(b"\xef\xbb\xbf")
    if encoding == "utf-8-sig":
        encoding, bom = "utf-8", True
    out = text.encode(encoding)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + out)
