"""`acc new-backend NAME`: a working skeleton backend distribution, ready to pip install and test."""

from __future__ import annotations

import re
from pathlib import Path

import click

from acc.errors import AccError

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "backend"


def render(name: str, target: Path) -> list[Path]:
    """Write the template for backend `name` into `target` (which must not exist or be empty)."""
    from acc.contract.hookspecs import HOOKSPEC_VERSION

    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise AccError(f"backend name {name!r}: use lower-case letters, digits and underscores, starting with a letter "
                       "(it becomes the entry-point name and part of the package name acc_<name>)")
    if target.exists() and any(target.iterdir()):
        raise AccError(f"{target} exists and is not empty; choose another --dir")
    written = []
    for source in sorted(TEMPLATE.rglob("*.tmpl")):
        relative = source.relative_to(TEMPLATE).with_suffix("")  # drop .tmpl
        path = target / Path(*[part.replace("acc_NAME", f"acc_{name}") for part in relative.parts])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source.read_text().format(name=name, upper=name.upper(), hookspec_version=HOOKSPEC_VERSION))
        written.append(path)
    return written


@click.command("new-backend")
@click.argument("name")
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=None,
              help="Where to write it (default: ./acc-NAME).")
def new_backend(name: str, directory: Path | None) -> None:
    """Write a skeleton backend distribution NAME: entry point, one hook per selection hook, conformance tests."""
    target = directory or Path(f"acc-{name.replace('_', '-')}")
    files = render(name, target)
    click.echo(f"wrote {len(files)} files to {target}/")
    click.echo(f"next: pip install -e {target} && acc plugins && (cd {target} && pytest)")
