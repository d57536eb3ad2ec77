"""Accelerate's `accelerate.inference`: `prepare_pippy`, pipeline-parallel inference (one stage per process) on
torch's `torch.distributed.pipelining`. The code is `acc.big_model.pipeline`."""

from __future__ import annotations

from typing import Any

PIPELINE_INFERENCE = True  # whether prepare_pippy runs (acc.test_utils.require_pippy skips its tests otherwise)


def prepare_pippy(model: Any, split_points: Any = "auto", no_split_module_classes: Any = None,
                  example_args: Any = (), example_kwargs: Any = None, num_chunks: Any = None,
                  gather_output: bool = False) -> Any:
    """`model` whose forward runs as a pipeline over the run's processes: traced with `example_args` /
    `example_kwargs` (one micro-batch), cut at `split_points` (module names where stages 2.. begin, or "auto": an
    even cut by size, never inside `no_split_module_classes`), `num_chunks` micro-batches per call (default: the
    processes). The last process gets the output; every process with `gather_output`."""
    from acc.big_model.pipeline import prepare_pippy as prepare

    return prepare(model, split_points, no_split_module_classes, example_args, example_kwargs, num_chunks,
                   gather_output)


__all__ = ["prepare_pippy"]
