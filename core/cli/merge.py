"""`acc merge-weights DIR OUT`: one safetensors file of a model's full weights from a sharded checkpoint."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("merge-weights")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--model", "index", type=int, default=0, show_default=True, help="Which prepared model (0, 1, ...).")
def merge_weights(checkpoint: Path, out: Path, index: int) -> None:
    """Assemble the model weights of a sharded checkpoint (saved by save_state on a sharding backend, on any
    number of processes) into one safetensors file OUT that loads into the plain model. The backend that saved
    it (named in its manifest) reads its own format (acc_merge_weights); it must be installed."""
    import json

    from acc.checkpointing.merge import merge_weights as merge

    backend, names = merge(checkpoint, out, index)
    click.echo(json.dumps({"out": str(out), "tensors": len(names), "backend": backend}))
