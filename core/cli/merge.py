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
    number of processes) into one safetensors file OUT that loads into the plain model."""
    import json

    from ..checkpoint import CheckpointError, read_manifest, verify
    from ..sharded import META_KEY, merge

    manifest = read_manifest(checkpoint)
    pieces = []
    for name in sorted(manifest["files"]):
        if name.endswith(".safetensors"):
            path = verify(checkpoint, manifest, name)
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                if META_KEY in (handle.metadata() or {}):
                    pieces.append(path)
    if not pieces:
        whole = [n for n in manifest["files"] if n == f"model_{index}.safetensors"]
        hint = f"; its weights are already one file: {checkpoint / whole[0]}" if whole else ""
        raise CheckpointError(f"{checkpoint} is not a sharded checkpoint (no piece files){hint}")
    out.parent.mkdir(parents=True, exist_ok=True)
    names = merge(pieces, out, prefix=f"model.{index}.")
    click.echo(json.dumps({"out": str(out), "tensors": len(names), "from_pieces": len(pieces)}))
