"""`acc plot RUN_DIR...`: a PNG of the scalars the built-in jsonl tracker logged, one panel per metric, every run
overlaid. matplotlib is imported only here (the optional extra `acc-core[plot]`). Torch-free."""

from __future__ import annotations

import math
from pathlib import Path

import click

from acc.errors import AccError


def _matplotlib():
    try:
        import matplotlib
    except ImportError as exc:
        raise AccError(f"acc plot draws with matplotlib, which is not installed ({exc}); install with: "
                       "pip install 'acc-core[plot]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


@click.command("plot")
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_DIR...")
@click.option("-o", "--output", default="acc-plot.png", show_default=True, help="The PNG to write.")
@click.option("-m", "--metric", "metrics", multiple=True, metavar="NAME",
              help="Plot only this metric (repeat for several; default: every numeric one).")
@click.option("--log-y", is_flag=True, help="A logarithmic y axis (losses).")
def plot(run_dirs: tuple[str, ...], output: str, metrics: tuple[str, ...], log_y: bool) -> None:
    """Plot the metrics the jsonl tracker logged (log_with="jsonl").

    Each RUN_DIR is a run file (<logging_dir>/<project>/<run>.jsonl) or a directory searched for them (a
    project_dir, a project's directory). Every run is one line in each metric's panel, so several runs are
    compared at a glance: acc plot runs/lr-0.1 runs/lr-0.01 -o compare.png
    """
    from acc.builtin.jsonl import find_runs, read_run

    for given in run_dirs:
        if not Path(given).exists():
            raise AccError(f"acc plot: {given} does not exist (give run files or the directories that hold them)")
    runs = [read_run(path) for path in find_runs(run_dirs)]
    if not runs:
        raise AccError(f"acc plot: no run file of the jsonl tracker under {', '.join(run_dirs)} (a run file is "
                       "<logging_dir>/<project>/<run>.jsonl, written with Accelerator(log_with=\"jsonl\", "
                       "project_dir=...))")
    names = list(dict.fromkeys(name for run in runs for name in run.series))
    if metrics:
        missing = [m for m in metrics if m not in names]
        if missing:
            raise AccError(f"acc plot: no run logged {', '.join(missing)}; logged: {', '.join(names) or 'nothing'}")
        names = list(metrics)
    if not names:
        raise AccError(f"acc plot: the {len(runs)} run(s) found logged no numeric value")
    plt = _matplotlib()
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False)
    labels = _labels(runs)
    for index, name in enumerate(names):
        ax = axes[index // columns][index % columns]
        for run, label in zip(runs, labels):
            points = run.series.get(name)
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, label=label, marker="." if len(points) < 30 else None)
        ax.set_title(name)
        ax.set_xlabel("step")
        if log_y and all(y > 0 for run in runs for _, y in run.series.get(name, [])):
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if len(runs) > 1:
            ax.legend(fontsize="small")
    for index in range(len(names), rows * columns):
        axes[index // columns][index % columns].axis("off")
    figure.tight_layout()
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    click.echo(f"wrote {out}: {len(names)} metric(s) ({', '.join(names)}) from {len(runs)} run(s)")


def _labels(runs: list) -> list[str]:
    """A legend label per run: project/run, or the file path when two runs would read the same."""
    labels = [run.label for run in runs]
    if len(set(labels)) < len(labels):
        labels = [str(run.path) for run in runs]
    return labels
