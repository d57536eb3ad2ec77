"""Accelerate's N-D parallelism configuration: `ParallelismConfig` (data parallel replicate x shard, tensor, context
and sequence parallel sizes over one device mesh) and its handlers, with Accelerate's field names, defaults,
`PARALLELISM_CONFIG_*` environment variables and checks. The public paths are `acc.parallelism_config` and
`acc.utils.dataclasses`.

Torch-free to import: `build_device_mesh` imports torch when it builds the mesh.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

ENV = "PARALLELISM_CONFIG_"
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")  # the mesh's dimensions, outermost first
CP_STRATEGIES = ("allgather", "alltoall")
SP_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV + name, default)


def _version_at_least(package: str, minimum: str) -> bool:
    from acc.compat.versions import compare_versions

    try:
        return compare_versions(package, ">=", minimum)
    except Exception:  # noqa: BLE001 - a package that is not installed is below every version
        return False


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


@dataclass
class TorchContextParallelConfig:
    """Context parallelism with torch's `context_parallel`: `cp_comm_strategy` "allgather" (the default, or
    PARALLELISM_CONFIG_CP_COMM_STRATEGY) or "alltoall"."""

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        from acc.compat.accelerate_constants import BETA_CP_AVAILABLE_PYTORCH_VERSION

        if not _version_at_least("torch", BETA_CP_AVAILABLE_PYTORCH_VERSION):
            raise ValueError(f"context parallelism needs torch >= {BETA_CP_AVAILABLE_PYTORCH_VERSION}")
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = _env("CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in CP_STRATEGIES:
            raise ValueError(f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or "
                             "'alltoall'.")


@dataclass
class DeepSpeedSequenceParallelConfig:
    """DeepSpeed's sequence parallelism (Ulysses/ALST): a fixed `sp_seq_length`, or variable lengths
    (`sp_seq_length_is_variable`, the default), and the attention implementation (`sp_attn_implementation`: one of
    SP_ATTENTION or a hub flash-attention kernel such as "kernels-community/flash-attn2")."""

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            self.sp_seq_length_is_variable = _env("SP_SEQ_LENGTH_IS_VARIABLE", "true").lower() == "true"
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            given = os.environ.get(ENV + "SP_SEQ_LENGTH")
            if given is None:
                raise ValueError("sp_seq_length_is_variable is False, so sp_seq_length must be given (argument, or "
                                 f"the environment variable {ENV}SP_SEQ_LENGTH)")
            self.sp_seq_length = None if given == "None" else int(given)
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = os.environ.get(ENV + "SP_ATTN_IMPLEMENTATION")
        attn = self.sp_attn_implementation
        if attn is not None and attn not in SP_ATTENTION and not ("/" in attn and "flash-attn" in attn):
            raise ValueError(f"Invalid sp_attn_implementation: {attn}. Must be one of {list(SP_ATTENTION)} or a "
                             "hub-hosted flash attention kernel (e.g. 'kernels-community/flash-attn2'); 'eager' and "
                             "'flex_attention' do not work with sequence parallelism.")


@dataclass
class TorchTensorParallelConfig:
    """Tensor parallelism with torch's `parallelize_module`; `enable_async_tp` is not supported (warned, ignored)."""

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        from acc.compat.accelerate_constants import (
            BETA_TP_AVAILABLE_PYTORCH_VERSION,
            BETA_TP_AVAILABLE_TRANSFORMERS_VERSION,
        )

        if not _version_at_least("torch", BETA_TP_AVAILABLE_PYTORCH_VERSION):
            raise ValueError(f"tensor parallelism needs torch >= {BETA_TP_AVAILABLE_PYTORCH_VERSION}")
        # acc's tensor parallel runs plain torch modules: transformers is needed only for its models' own plans, so
        # only an older transformers that is installed is refused (Accelerate refuses its absence too)
        if _installed("transformers") and not _version_at_least("transformers", BETA_TP_AVAILABLE_TRANSFORMERS_VERSION):
            raise ValueError(f"TP requires transformers >= {BETA_TP_AVAILABLE_TRANSFORMERS_VERSION}")
        if self.enable_async_tp:
            warnings.warn("enable_async_tp: asynchronous tensor parallelism is not supported; ignored", stacklevel=2)


@dataclass
class ParallelismConfig:
    """The parallel dimensions of a run: data parallel replicated (`dp_replicate_size`) and sharded
    (`dp_shard_size`), tensor (`tp_size`), context (`cp_size`, backend "torch") and sequence parallel (`sp_size`,
    backend "deepspeed"). A size not given is read from PARALLELISM_CONFIG_<NAME>_SIZE, else 1; their product is the
    number of processes. `build_device_mesh` makes the device mesh with the dimensions larger than 1, named as
    Accelerate names them, plus the flattened `dp`, `dp_shard_cp` and `dp_cp` dimensions."""

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: DeepSpeedSequenceParallelConfig | None = None
    device_mesh: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for dim in ("dp_replicate", "dp_shard", "tp", "cp", "sp"):
            if getattr(self, f"{dim}_size") is None:
                setattr(self, f"{dim}_size", int(_env(f"{dim.upper()}_SIZE", "1")))
            if getattr(self, f"{dim}_size") < 1:
                raise ValueError(f"{dim}_size must be at least 1, but got {getattr(self, f'{dim}_size')}")
        self.cp_backend = self.cp_backend or _env("CP_BACKEND", "torch")
        self.sp_backend = self.sp_backend or _env("SP_BACKEND", "deepspeed")
        if self.cp_backend != "torch":
            raise ValueError(f"cp_backend must be one of ['torch'], but got {self.cp_backend}")
        if self.sp_backend != "deepspeed":
            raise ValueError(f"sp_backend must be one of ['deepspeed'], but got {self.sp_backend}")
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1:
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            elif not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise ValueError(f"cp_backend={self.cp_backend} takes a TorchContextParallelConfig as cp_handler, "
                                 f"not a {type(self.cp_handler).__name__}")
        if self.sp_size > 1 and self.sp_handler is None:
            self.sp_handler = DeepSpeedSequenceParallelConfig()
        if self.cp_size > 1 and self.sp_size > 1:
            raise ValueError(f"context parallelism (cp_size={self.cp_size}) and sequence parallelism "
                             f"(sp_size={self.sp_size}) exclude each other: set one of them to 1")
        if (self.tp_size > 1 or self.cp_size > 1) and self.dp_replicate_size > 1 and self.dp_shard_size == 1:
            raise ValueError("tensor/context parallelism (tp_size or cp_size > 1) does not compose with pure "
                             f"replication (dp_replicate_size={self.dp_replicate_size}, dp_shard_size=1): shard "
                             "with dp_shard_size > 1 (FSDP + TP/CP), with or without dp_replicate_size (HSDP + TP/CP)")

    # ------------------------------------------------------------------ sizes and names
    @property
    def _sizes(self) -> dict[str, int]:
        return {"dp_replicate": self.dp_replicate_size, "dp_shard": self.dp_shard_size, "tp": self.tp_size,
                "cp": self.cp_size, "sp": self.sp_size}  # type: ignore[dict-item]

    def _set_size(self, dim: str, size: int) -> None:
        if dim not in self._sizes:
            raise ValueError(f"no parallel dimension {dim!r}; the dimensions are {list(self._sizes)}")
        setattr(self, f"{dim}_size", size)

    def _enabled(self, *dims: str) -> list[str]:
        return [d for d in dims if self._sizes[d] > 1]

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate_size > 1  # type: ignore[operator]

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard_size > 1  # type: ignore[operator]

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1  # type: ignore[operator]

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1  # type: ignore[operator]

    @property
    def sp_enabled(self) -> bool:
        return self.sp_size > 1  # type: ignore[operator]

    @property
    def dp_dim_names(self) -> list[str]:
        return self._enabled("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list[str]:
        return self._enabled("tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        return self._enabled("dp_shard", "cp")

    @property
    def dp_cp_dim_names(self) -> list[str]:
        return self._enabled("dp_replicate", "dp_shard", "cp")

    @property
    def fsdp_dim_names(self) -> list[str]:
        return self._enabled("dp_replicate") + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    @property
    def total_size(self) -> int:
        size = 1
        for value in self._sizes.values():
            size *= value
        return size

    @property
    def non_data_parallel_size(self) -> int:
        return self.tp_size * self.cp_size * self.sp_size  # type: ignore[operator]

    @property
    def data_parallel_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size  # type: ignore[operator]

    # ------------------------------------------------------------------ the mesh
    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]] | tuple[()]:
        """(dimension names, sizes) of the mesh, outermost first (MESH_ORDER); () when no dimension is above 1."""
        dims = sorted(self.active_mesh_dims, key=MESH_ORDER.index)
        if not dims:
            return ()
        return tuple(dims), tuple(self._sizes[d] for d in dims)

    def build_device_mesh(self, device_type: str) -> Any:
        """A torch `DeviceMesh` of this configuration on `device_type` ("cuda", "cpu", ...), with the flattened
        `dp`, `dp_shard_cp` and `dp_cp` dimensions; None when no dimension is above 1, or when DeepSpeed's sequence
        parallelism (which makes its own groups) is on."""
        if self.sp_backend == "deepspeed" and self.sp_enabled:
            return None
        mesh = self._get_mesh()
        if not mesh:
            return None
        import torch.distributed.device_mesh as device_mesh

        names, shape = mesh
        built = device_mesh.init_device_mesh(device_type, shape, mesh_dim_names=names)
        for dims, flat in ((self.dp_dim_names, "dp"), (self.dp_shard_cp_dim_names, "dp_shard_cp"),
                           (self.dp_cp_dim_names, "dp_cp")):
            if dims:
                built[dims]._flatten(flat)
        return built

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh, built on the first call (which names the device type)."""
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError("the device mesh is not built yet: pass a device_type, e.g. 'cuda' or 'cpu'")
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(f"the device mesh was built on {self.device_mesh.device_type}, not {device_type}")
        return self.device_mesh

    def to_json(self) -> dict[str, Any]:
        """The configuration as plain data (the mesh left out)."""
        return {k: (dict(vars(v)) if hasattr(v, "__dict__") else v) for k, v in vars(self).items()
                if k != "device_mesh"}



def refuse_recurrent_layers_under_sequence_parallelism(model: Any) -> None:
    """Sequence parallelism (DeepSpeed's Ulysses) gathers the whole sequence before attention, which linear-attention
    layers bypass: each rank would restart their recurrent state and the gradients would be wrong without failing.
    A transformers model whose config lists such layers (`layer_types` with "linear_attention") is refused."""
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    recurrent = sorted({kind for kind in getattr(config, "layer_types", None) or [] if "linear_attention" in kind})
    if recurrent:
        raise ValueError(f"Sequence parallelism does not support attention layers of type {recurrent} (model "
                         f"{type(model).__name__}): they carry a recurrent state along the sequence outside the "
                         "attention interface, so sharding the sequence would restart it on every rank and give wrong "
                         "gradients silently. Use a full-attention model, or turn sequence parallelism off.")


__all__ = ["DeepSpeedSequenceParallelConfig", "ParallelismConfig", "TorchContextParallelConfig",
           "TorchTensorParallelConfig",
           "refuse_recurrent_layers_under_sequence_parallelism"]
