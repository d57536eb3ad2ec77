"""Accelerate's `accelerate.parallelism_config`: `ParallelismConfig`, the parallel dimensions of a run over one
device mesh (data parallel replicated and sharded, tensor, context and sequence parallel). The code is
`acc.compat.parallelism_objects`. Torch-free to import."""

from acc.compat.parallelism_objects import ParallelismConfig

__all__ = ["ParallelismConfig"]
