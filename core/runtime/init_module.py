"""Building models sharded: `accelerator.init_module()` (Lightning Fabric's name) on a backend that shards.

Under a sharding backend no process should hold a whole copy of the model, not even while building it. The
backend answers `acc_init_module` with a `ShardedBuild`: the context the model is built in, which part of each
parameter this process keeps (`part`: a range of the row-major flattened tensor) and how a value for that part is
put in place (`store`). `acc.load_checkpoint_in_model` uses the last two to read only this process's bytes of
each tensor from a safetensors checkpoint. Backends without an answer build normally (every process holds the
whole model, as ddp trains it).

`MetaBuild` is the build of backends that shard after building (fsdp): parameters are created on the meta device
(buffers stay real, as with Accelerate's `init_empty_weights()`); when the context ends every module's own
`reset_parameters()` is replayed, in the order the modules were completed, on full-size temporaries of one module
at a time, from rank 0's random state at the context's entry, and only this process's part of each result is
kept. A model whose layers initialise themselves in `reset_parameters` (torch's layers do) therefore gets the
weights a normal build gets with the same seed, and the random stream continues as after a normal build; the
backend then shards the model on the meta device and fills its shards with these parts.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from acc.contract.sharded_build import ShardedBuild, Split, dim0_split, flat_split
from acc.errors import AccError

Call = tuple[nn.Module, str, dict[int, dict[str, Any]]]  # a module, its reset method, its subtree's parameters then
RESETS = ("reset_parameters", "_reset_parameters")  # torch's layers use both names (MultiheadAttention the second)


class MetaBuild(ShardedBuild):
    """Parameters on the meta device, initialised part by part when the context ends (see the module docstring).

    :param split: which flat range process `index` keeps of a tensor of a given shape.
    :param index: this process's index in the split (its coordinate on the sharding dimension).
    :param broadcast_object: the run's `broadcast_object(obj, src)` (rank 0's random state is used everywhere).
    :param initialize: False (Fabric's `empty_init=True`): no initialisation; every parameter must be loaded.
    """

    materializes_meta = True

    def __init__(self, split: Split, index: int, broadcast_object: Callable[[Any, int], Any] | None = None,
                 initialize: bool = True):
        self._split, self._index, self._broadcast = split, index, broadcast_object
        self._initialize = initialize
        self._params: dict[int, nn.Parameter] = {}
        self._parts: dict[int, torch.Tensor] = {}

    # -- the interface
    def owns(self, param: torch.Tensor) -> bool:
        return self._params.get(id(param)) is param

    def part(self, param: torch.Tensor) -> tuple[int, int]:
        return self._split(tuple(param.shape), self._index)

    def store(self, param: torch.Tensor, values: torch.Tensor) -> None:
        start, stop = self.part(param)
        if values.dim() != 1 or values.numel() != stop - start:
            raise AccError(f"a stored part has {values.numel()} element(s) of shape {tuple(values.shape)}; this "
                           f"process keeps elements {start}..{stop} of the {tuple(param.shape)} parameter")
        self._parts[id(param)] = values.detach().to(param.dtype)

    def has_value(self, param: torch.Tensor) -> bool:
        return id(param) in self._parts

    def take(self, param: torch.Tensor) -> torch.Tensor | None:
        """This process's part of `param` (1-D), handed over (the build keeps no reference, so the part's memory
        goes once the backend copied it into its shard), or None when it has none (never initialised nor loaded)."""
        return self._parts.pop(id(param), None) if self.owns(param) else None

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        from acc.runtime.empty_weights import init_empty_weights

        seen: dict[int, nn.Module] = {}
        children: set[int] = set()
        calls: list[Call] = []  # reset_parameters() calls, outermost only
        registered: dict[tuple[int, str], torch.Tensor] = {}  # parts of real values given at registration
        depth = [0]

        def watch(module: nn.Module) -> None:
            if id(module) in seen:
                return
            seen[id(module)] = module
            for method in RESETS:
                reset = getattr(module, method, None)
                if callable(reset):
                    object.__setattr__(module, method, record(module, method, reset))

        def record(module: nn.Module, method: str, reset: Callable) -> Callable:
            def recorded(*args: Any, **kwargs: Any) -> Any:
                if depth[0] == 0:  # where a normal build draws: replayed with the parameters of this moment
                    calls.append((module, method, {id(m): dict(m._parameters) for m in module.modules()}))
                depth[0] += 1
                try:
                    return reset(*args, **kwargs)
                finally:
                    depth[0] -= 1

            recorded.__acc_recorded__ = True  # type: ignore[attr-defined]
            return recorded

        def on_parameter(module: nn.Module, name: str, param: Any) -> None:
            watch(module)
            resets = any(callable(getattr(module, m, None)) for m in RESETS)
            if isinstance(param, torch.Tensor) and not param.is_meta and not resets:  # e.g. nn.Parameter(torch.zeros(n))
                start, stop = self._split(tuple(param.shape), self._index)
                registered[(id(module), name)] = param.detach().reshape(-1)[start:stop].clone()

        def on_module(module: nn.Module, name: str, submodule: Any) -> None:
            watch(module)
            if isinstance(submodule, nn.Module):
                watch(submodule)
                children.add(id(submodule))

        entry = torch.get_rng_state()
        handles = [nn.modules.module.register_module_parameter_registration_hook(on_parameter),
                   nn.modules.module.register_module_module_registration_hook(on_module)]
        written = _Writes(depth)
        try:
            with init_empty_weights(), written:
                yield
        finally:
            for handle in handles:
                handle.remove()
            for module in seen.values():
                for method in RESETS:
                    if getattr(module.__dict__.get(method), "__acc_recorded__", False):
                        del module.__dict__[method]
        for module in seen.values():
            for name, param in module._parameters.items():
                value = registered.get((id(module), name))
                if value is not None and param is not None and param.is_meta and value.numel() == (
                        lambda r: r[1] - r[0])(self.part(param)):
                    self._parts[id(param)] = value.to(param.dtype)
        roots = [m for key, m in seen.items() if key not in children]
        final = {id(p): p for root in roots for p in root.parameters() if p.is_meta}
        lost = [name for root in roots for name, p in root.named_parameters()
                if p.is_meta and p.untyped_storage()._cdata in written.storages]
        if lost and self._initialize:
            warnings.warn(f"{', '.join(lost[:5])}{' and more' if len(lost) > 5 else ''}: initialised while the model "
                          "was built under init_module() outside any reset_parameters() (e.g. by an _init_weights "
                          "pass), which cannot be replayed on the shards: they keep their modules' reset_parameters() "
                          "values; move that initialisation into reset_parameters(), or load the weights",
                          stacklevel=3)
        if self._initialize:
            self._replay(calls, entry, roots)
        self._params = final
        self._parts = {key: value for key, value in self._parts.items() if key in final}

    # -- initialisation
    def _replay(self, calls: list[Call], entry: torch.Tensor,
                roots: list[nn.Module]) -> None:
        drew = not torch.equal(entry, torch.get_rng_state())
        if self._broadcast is not None:
            entry = self._broadcast(entry, 0)
        torch.set_rng_state(entry)
        for module, method, parameters in calls:
            self.initialize_module(module, method, parameters)
        late = []  # modules whose reset_parameters() did not run while building (their __init__ does not call it)
        for root in roots:
            for module in _post_order(root):
                own = [p for p in module._parameters.values() if p is not None and p.is_meta]
                method = next((m for m in RESETS if callable(getattr(module, m, None))), None)
                if own and method and any(id(p) not in self._parts for p in own):
                    self.initialize_module(module, method)
                    late.append(type(module).__name__)
        if late and calls:  # (adopting a model built elsewhere, every module is initialised now by design)
            warnings.warn(f"{', '.join(sorted(set(late)))}: reset_parameters() did not run while the model was "
                          "built, so it was run afterwards to initialise their parameters; a normal build may have "
                          "initialised them otherwise", stacklevel=4)
        if drew:
            warnings.warn("random numbers were drawn while the model was built under init_module() outside "
                          "reset_parameters() (e.g. torch.randn in an __init__): the initialisation replayed on the "
                          "shards cannot reproduce their order, so the weights differ from a normal build with the "
                          "same seed; move such initialisation into the module's reset_parameters()", stacklevel=4)

    def initialize_module(self, module: nn.Module, method: str = "reset_parameters",
                          parameters: dict[int, dict[str, Any]] | None = None) -> None:
        """Run `module.reset_parameters()` on full-size temporaries of its subtree's meta parameters, one module
        at a time, and keep this process's part of each (parts already kept are put back in first, so a
        reset that initialises only some of them leaves the others as they were)."""
        owners = list(module.modules())
        current = [owner._parameters for owner in owners]
        temps: dict[int, nn.Parameter] = {}
        metas: dict[int, nn.Parameter] = {}
        for owner in owners:
            swapped = {}
            for name, param in (parameters or {}).get(id(owner), owner._parameters).items():
                if param is not None and param.is_meta:
                    if id(param) not in temps:
                        temps[id(param)] = nn.Parameter(self._temporary(param), requires_grad=param.requires_grad)
                        metas[id(param)] = param
                    param = temps[id(param)]
                swapped[name] = param
            owner._parameters = swapped
        try:
            with torch.no_grad():
                getattr(module, method)()
        finally:
            for owner, parameters in zip(owners, current):
                owner._parameters = parameters
        for key, param in metas.items():
            start, stop = self.part(param)
            values = temps[key].detach().reshape(-1)[start:stop]
            if key in self._parts or not _untouched(values):
                self._parts[key] = values.clone()

    def _temporary(self, param: nn.Parameter) -> torch.Tensor:
        fill = float("nan") if param.dtype.is_floating_point or param.dtype.is_complex else 0
        temp = torch.full(param.shape, fill, dtype=param.dtype)
        kept = self._parts.get(id(param))
        if kept is not None:
            start, stop = self.part(param)
            temp.view(-1)[start:stop] = kept
        return temp

    def adopt(self, model: nn.Module) -> None:
        """Take over a model built on the meta device elsewhere (`acc.init_empty_weights()`): its modules'
        reset_parameters() are run, children before parents, from rank 0's current random state."""
        if self._initialize:
            self._replay([], torch.get_rng_state(), [model])
        self._params.update({id(p): p for p in model.parameters() if p.is_meta})


class _Writes(TorchDispatchMode):
    """Collects the storages of meta tensors written outside any recorded reset_parameters() call."""

    def __init__(self, depth: list[int]):
        super().__init__()
        self.depth, self.storages = depth, set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.depth[0] == 0 and func._schema.is_mutable:
            for index, argument in enumerate(func._schema.arguments):
                if argument.alias_info is not None and argument.alias_info.is_write:
                    value = args[index] if index < len(args) else kwargs.get(argument.name)
                    if isinstance(value, torch.Tensor) and value.is_meta:
                        self.storages.add(value.untyped_storage()._cdata)
        return func(*args, **kwargs)


def _untouched(values: torch.Tensor) -> bool:
    """A part still all NaN (floating point) was not initialised by the reset that ran."""
    if not values.numel():
        return False
    return bool(torch.isnan(values).all()) if values.is_floating_point() else False


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    seen: set[int] = set()

    def visit(m: nn.Module) -> Iterator[nn.Module]:
        for child in m.children():
            if id(child) not in seen:
                seen.add(id(child))
                yield from visit(child)
        yield m

    yield from visit(module)


# ---------------------------------------------------------------------------------------------- the kernel side


def has_meta(model: nn.Module) -> bool:
    """Whether any parameter of `model` is on the meta device (built without values)."""
    return any(p.is_meta for p in model.parameters())


def meta_names(model: nn.Module, limit: int = 3) -> str:
    names = [n for n, p in model.named_parameters() if p.is_meta]
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_quantized_placement(model: nn.Module, distributed: bool, cpu_kernels: bool) -> None:
    """Refuse to train a bitsandbytes 8-bit/4-bit model (transformers' `is_loaded_in_8bit`/`_4bit`) that its
    `hf_device_map` spreads over several devices in a distributed run, or offloads to the disk, or to the CPU
    without bitsandbytes' CPU kernels (`cpu_kernels`), as Accelerate refuses it."""
    if not (getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)):
        return
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return
    devices = set(device_map.values())
    if len(devices) > 1 and distributed:
        raise ValueError(f"this 8-bit/4-bit model is placed on several devices ({sorted(map(str, devices))}), which "
                         "cannot train in a distributed run: load it on one device per process, e.g. "
                         "device_map={'': accelerator.process_index}")
    if "disk" in devices or ("cpu" in devices and not cpu_kernels):
        raise ValueError(f"You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk "
                         f"offload (its hf_device_map places modules on {sorted(map(str, devices))}): load it "
                         "entirely on the GPU, e.g. device_map={'': 0}, or install a bitsandbytes with CPU kernels "
                         "(multi-backend) for CPU offload")


def check_meta_models(models: list[nn.Module], backend: str, build: Any) -> None:
    """Refuse, before the backend sees them, models with meta parameters that this backend cannot give values."""
    if getattr(build, "materializes_meta", False):
        return
    for model in models:
        if has_meta(model):
            raise AccError(
                f"the model passed to prepare() has parameters on the meta device ({meta_names(model)}), which the "
                f"{backend} backend does not give values to (it trains a whole copy per process, or builds sharded "
                "only inside init_module()): load its weights first (acc.load_checkpoint_in_model(model, path)), or "
                "build it inside `with accelerator.init_module():` instead of init_empty_weights()")


def check_empty_init(empty_init: Any) -> None:
    if empty_init is not None and not isinstance(empty_init, bool):
        raise TypeError(f"init_module(empty_init={empty_init!r}): expected True, False or None (None: the backend "
                        "decides; True: the weights will be loaded, skip initialising them where the backend can; "
                        "False: a normal build)")


def owner_of(param: torch.Tensor, builds: list[ShardedBuild]) -> ShardedBuild | None:
    """The build that made `param`, if any."""
    return next((b for b in reversed(builds) if b.owns(param)), None)


__all__ = ["MetaBuild", "ShardedBuild", "Split", "check_empty_init", "check_meta_models", "dim0_split", "flat_split",
           "has_meta", "owner_of"]
