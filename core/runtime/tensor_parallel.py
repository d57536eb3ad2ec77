"""Tensor parallelism on the run mesh's `tp` dimension: a model's TP plan, resolved to torch's parallel styles and
applied with `torch.distributed.tensor.parallel.parallelize_module` (for a backend that declares `tp` in
`Capabilities.mesh_dims`; the fsdp backend does, and shards over the dp dimensions after).

A plan maps module-name patterns (fnmatch: `blocks.*.up`, `*.proj`) to a style: "colwise" (the Linear's output
features split, its output left sharded on the last dim), "rowwise" (input features split, the output summed to a
whole one), "sequence_parallel" (a norm or dropout run on a slice of the sequence, dim 1), their `_rep` variants
("colwise_rep": output gathered whole; "rowwise_rep": input given whole) or a torch `ParallelStyle` object.
transformers' plain styles are read too: "colwise_gather_output" (= colwise_rep), "rowwise_split_input" (=
rowwise_rep) and "embedding_rowwise" (an Embedding's vocabulary split, the ids given whole); its styles that need
its own modules (packed_colwise, replicated_with_grad_allreduce, local_*, ...) are refused, naming the way that
works (`from_pretrained(tp_plan="auto")`). acc reads the plan from `model.tp_plan` (acc's spelling, also
transformers' full plan) or transformers' `model._tp_plan`; a model whose parameters are already
DTensors on a `tp` mesh (transformers' `from_pretrained(tp_plan="auto", device_mesh=...)`) is left as it is.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from acc.errors import AccError

STYLES = ("colwise", "rowwise", "sequence_parallel", "colwise_rep", "rowwise_rep")
TRANSFORMERS_STYLES = {"colwise_gather_output": "colwise_rep", "rowwise_split_input": "rowwise_rep",
                       "embedding_rowwise": "embedding_rowwise"}


def tp_plan_of(model: Any) -> dict[str, Any] | None:
    """The model's TP plan: `model.tp_plan` (acc's), else transformers' `model._tp_plan`, else None."""
    for attribute in ("tp_plan", "_tp_plan"):
        plan = getattr(model, attribute, None)
        if plan:
            if not isinstance(plan, dict):
                raise AccError(f"model.{attribute} is a {type(plan).__name__}: a TP plan is a dict of module-name "
                               f"patterns to styles ({', '.join(STYLES)}) or torch ParallelStyle objects")
            return dict(plan)
    return None


def is_tensor_parallel(model: Any) -> bool:
    """Whether some parameter of `model` is a DTensor on a mesh with a `tp` dimension (parallelized already)."""
    from torch.distributed.tensor import DTensor

    for param in model.parameters():
        if isinstance(param, DTensor) and "tp" in (param.device_mesh.mesh_dim_names or ()):
            return True
    return False


def style(name: Any, where: str) -> Any:
    """The torch ParallelStyle a plan's value names (a ParallelStyle is itself)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

    if isinstance(name, ParallelStyle):
        return name
    table = {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(),
        "sequence_parallel": lambda: SequenceParallel(),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    }
    name = TRANSFORMERS_STYLES.get(name, name) if isinstance(name, str) else name
    if name not in table:
        raise AccError(f"TP plan entry {where!r}: style {name!r} is not one of {', '.join(STYLES)}, transformers' "
                       f"{', '.join(TRANSFORMERS_STYLES)} (or a torch ParallelStyle such as "
                       "ColwiseParallel(output_layouts=Shard(1))); a transformers model whose plan uses its own "
                       "styles is parallelized by transformers: from_pretrained(..., tp_plan='auto')")
    return table[name]()


def resolve(model: Any, plan: dict[str, Any]) -> dict[str, Any]:
    """module name -> ParallelStyle for every module a plan pattern matches (the first matching pattern wins); a
    pattern that matches no module is an error naming some of the model's module names."""
    names = [name for name, _ in model.named_modules() if name]
    resolved: dict[str, Any] = {}
    for pattern, value in plan.items():
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise AccError(f"TP plan pattern {pattern!r} matches no module of the model; its modules include: "
                           f"{', '.join(names[:12])}{' ...' if len(names) > 12 else ''}")
        for hit in hits:
            resolved.setdefault(hit, style(value, pattern))
    return resolved


def apply_tensor_parallel(model: Any, tp_mesh: Any) -> Any:
    """`model` with its TP plan applied on the 1-D `tp_mesh` (in place; returned). A model already parallelized
    on a tp mesh is returned as it is; a model without a plan is an error saying how to give one."""
    from torch.distributed.tensor.parallel import parallelize_module

    if is_tensor_parallel(model):
        return model
    plan = tp_plan_of(model)
    if plan is None:
        raise AccError(f"ParallelismConfig(tp_size={tp_mesh.size()}): {type(model).__name__} has no TP plan. Give it "
                       "one as model.tp_plan = {'<module pattern>': 'colwise' | 'rowwise' | 'sequence_parallel', ...} "
                       "(e.g. {'*.up': 'colwise', '*.down': 'rowwise'}), or load a transformers model with "
                       "from_pretrained(..., tp_plan='auto', device_mesh=accelerator.torch_device_mesh['tp'])")
    parallelize_module(model, tp_mesh, resolve(model, plan))
    return model


__all__ = ["STYLES", "apply_tensor_parallel", "is_tensor_parallel", "resolve", "style", "tp_plan_of"]
