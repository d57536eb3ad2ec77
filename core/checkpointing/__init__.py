"""Checkpoints on disk, and Accelerate's `accelerate.checkpointing` path.

`checkpointer` is what `Accelerator.save_state`/`load_state`/`save_model`/`save` do (exact resume, the save and load
pre-hooks); `files` the checkpoint directory itself (crash-safe writes, a manifest with checksums, loading that runs no
code, `ProjectConfiguration`); `hashed_io` the bytes written and hashed in one pass; `confine` reading only what lies
inside a directory; `pieces` sharded tensors written per rank and read on any number of ranks; `merge` one weights
file from a sharded checkpoint (`acc merge-weights`, `merge_fsdp_weights`).

Imports `acc.runtime` (nested tensor operations, the prepared objects), `acc.assembly` (the run manifest),
`acc.contract` and `acc.errors`; torch where tensors are read or written.
"""
