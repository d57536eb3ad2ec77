"""One safetensors file of a model's full weights from a sharded checkpoint (`acc merge-weights`,
`merge_fsdp_weights`): the backend that saved it (named in its manifest) reads its own format
(`acc_merge_weights`), so it must be installed. Torch-free until the backend reads tensors.
"""

from __future__ import annotations

from pathlib import Path


def merge_weights(checkpoint: Path, out: Path, index: int = 0) -> tuple[str, list[str]]:
    """Write model `index` of the checkpoint at `checkpoint` to `out`; returns the backend that read it and the
    names of the tensors written."""
    from acc.assembly.choose import assemble
    from acc.assembly.plugins import installed_backends, selection_caller
    from acc.checkpointing.files import read_manifest
    from acc.errors import CheckpointError

    manifest = read_manifest(checkpoint)
    backend = manifest.get("run", {}).get("backend") or "cpu"
    if backend != "cpu" and backend not in installed_backends():
        raise CheckpointError(f"{checkpoint} was saved by backend '{backend}', which is not installed here; its "
                              f"plugin reads its checkpoint format: install it (pip install acc-{backend})")
    pm = assemble(flags={"backend": backend}).pm
    out.parent.mkdir(parents=True, exist_ok=True)
    names = selection_caller(pm, "acc_merge_weights")(directory=checkpoint, manifest=manifest, index=index, out=out)
    return backend, list(names)
