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

    from acc.assembly.choose import assemble
    from acc.checkpoint import CheckpointError, read_manifest
    from acc.assembly.plugins import installed_backends, selection_caller

    manifest = read_manifest(checkpoint)
    backend = manifest.get("run", {}).get("backend") or "cpu"
    if backend != "cpu" and backend not in installed_backends():
        raise CheckpointError(f"{checkpoint} was saved by backend '{backend}', which is not installed here; its "
                              f"plugin reads its checkpoint format: install it (pip install acc-{backend})")
    pm = assemble(flags={"backend": backend}).pm
    out.parent.mkdir(parents=True, exist_ok=True)
    names = selection_caller(pm, "acc_merge_weights")(directory=checkpoint, manifest=manifest, index=index, out=out)
    click.echo(json.dumps({"out": str(out), "tensors": len(names), "backend": backend}))
