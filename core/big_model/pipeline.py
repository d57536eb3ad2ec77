"""Pipeline-parallel inference (Accelerate's `prepare_pippy`) on `torch.distributed.pipelining`: the model is traced
with one example micro-batch, split into one stage per process at the split points, and run with torch's GPipe
schedule. Process 0 feeds the batch (padded to a multiple of the micro-batches), the last process gets the output
(every process, with `gather_output`)."""

from __future__ import annotations

import types
from typing import Any

import torch

from acc.errors import AccError


def _units(module: torch.nn.Module, prefix: str, keep: set[str]) -> list[tuple[str, int]]:
    """(name, bytes of parameters) of the modules a cut may fall before, in order: leaves, and whole modules of the
    classes in `keep`."""
    found = []
    for name, child in module.named_children():
        full = prefix + name
        if type(child).__name__ in keep or next(child.children(), None) is None:
            found.append((full, sum(p.numel() * p.element_size() for p in child.parameters())))
        else:
            found += _units(child, full + ".", keep)
    return found


def auto_split_points(model: torch.nn.Module, stages: int, no_split_module_classes: Any = None) -> list[str]:
    """The module names where stages 2..`stages` begin: the cut of the model, in its order, into `stages` parts whose
    largest holds the fewest parameter bytes, never inside a module of `no_split_module_classes` (class names)."""
    if stages == 1:
        return []
    keep = {c if isinstance(c, str) else c.__name__ for c in (no_split_module_classes or ())}
    units = _units(model, "", keep)
    if len(units) < stages:
        raise AccError(f"prepare_pippy(split_points='auto'): the model has {len(units)} module(s) to cut between "
                       f"({', '.join(n for n, _ in units)}), too few for {stages} stages; give split_points")
    prefix = [0]
    for _, size in units:
        prefix.append(prefix[-1] + size)
    n = len(units)
    # best[k][i]: the smallest largest stage when units[:i] make k stages, and where the last of them starts
    best = [[(float("inf"), 0)] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0, 0)
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            best[k][i] = min(((max(best[k - 1][j][0], prefix[i] - prefix[j]), j) for j in range(k - 1, i)),
                             key=lambda t: t[0])
    points, i = [], n
    for k in range(stages, 1, -1):
        i = best[k][i][1]
        points.append(i)
    points.reverse()
    return [units[i][0] for i in points]


def batch_size_of(args: Any, kwargs: Any) -> int | None:
    """The size of dim 0 of the first tensor among the inputs."""
    for value in [*args, *(kwargs or {}).values()]:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def pad_rows(data: Any, rows: int, chunks: int) -> Any:
    """Every tensor of `data` (`rows` long in dim 0) padded with zero rows to the next multiple of `chunks`: each
    micro-batch then has the traced size. The output keeps the padded rows at its end."""
    from acc.runtime.ops import apply

    extra = -rows % chunks

    def pad(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] != rows:
            return t
        return torch.cat([t, t.new_zeros((extra, *t.shape[1:]))])

    return apply(pad, data) if extra else data


def prepare_pippy(model: torch.nn.Module, split_points: Any = "auto", no_split_module_classes: Any = None,
                  example_args: Any = (), example_kwargs: Any = None, num_chunks: int | None = None,
                  gather_output: bool = False) -> torch.nn.Module:
    """`model` whose forward runs as a pipeline over the run's processes (one stage each). `example_args` /
    `example_kwargs` are one micro-batch for tracing; `num_chunks` micro-batches per call (default: the processes);
    `split_points` the module names where stages 2.. begin, or "auto" (an even cut by size)."""
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    from acc.runtime.ops import send_to_device
    from acc.runtime.states import PartialState

    state = PartialState()
    processes = state.num_processes
    chunks = processes if num_chunks is None else int(num_chunks)
    model.hf_split_points = []
    if processes == 1:  # one stage: the model as it is
        return model
    if split_points == "auto":
        split_points = auto_split_points(model, processes, no_split_module_classes)
    points = list(split_points)
    if len(points) != processes - 1:
        raise AccError(f"prepare_pippy(split_points={points!r}): {len(points)} split point(s) make {len(points) + 1} "
                       f"stages, but the run has {processes} processes (one stage each): give {processes - 1}")
    names = {name for name, _ in model.named_modules()}
    unknown = [p for p in points if p not in names]
    if unknown:
        raise AccError(f"prepare_pippy(split_points=...): {unknown} name no module of the model")
    args = send_to_device(tuple(example_args), "cpu")
    kwargs = send_to_device(dict(example_kwargs or {}), "cpu")
    pipe = pipeline(model, mb_args=args, mb_kwargs=kwargs or None,
                    split_spec={p: SplitPoint.BEGINNING for p in points})
    stage = pipe.build_stage(state.local_process_index, device=state.device)
    schedule = ScheduleGPipe(stage, chunks)

    def forward(*call_args: Any, **call_kwargs: Any) -> Any:
        output = None
        if processes == 1:
            output = schedule.step(*call_args, **call_kwargs)
        elif state.process_index == 0:
            found = batch_size_of(call_args, call_kwargs)
            if found is None:
                raise ValueError("prepare_pippy: no tensor with a batch dimension among the inputs")
            if found % chunks:
                call_args, call_kwargs = pad_rows((call_args, call_kwargs), found, chunks)
            schedule.step(*call_args, **call_kwargs)
        elif state.process_index == processes - 1:
            output = schedule.step()
        else:
            schedule.step()
        if gather_output and processes > 1:
            output = _broadcast_from_last(output, processes)
        return output

    model._original_forward = model.forward
    model._original_call = model.__call__
    model.pippy_stage = schedule
    model.hf_split_points = points
    model.forward = types.MethodType(lambda self, *a, **k: forward(*a, **k), model)
    return model


def _broadcast_from_last(output: Any, processes: int) -> Any:
    """The last process's output on every process."""
    import torch.distributed as dist

    box = [output]
    dist.broadcast_object_list(box, src=processes - 1)
    return box[0]


__all__ = ["auto_split_points", "batch_size_of", "pad_rows", "prepare_pippy"]
