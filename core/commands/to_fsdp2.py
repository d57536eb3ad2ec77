"""Accelerate's `accelerate.commands.to_fsdp2` for acc: `accelerate to-fsdp2` rewrites the `fsdp_config` of an
Accelerate config file for FSDP2 (`fsdp_version: 2`), as Accelerate's command does: options FSDP2 dropped are left
out, `fsdp_sharding_strategy` becomes `fsdp_reshard_after_forward` (True for FULL_SHARD and HYBRID_SHARD), and keys
it does not know are carried over. acc's fsdp backend runs FSDP2 and reads either form.

Torch-free; PyYAML is imported only when the command reads or writes a file.
"""

import argparse
import enum
import logging
from pathlib import Path
from typing import Any, Optional

from acc.commands.config.config_args import import_yaml

logger = logging.getLogger(__name__)


class ConversionStatus(enum.Enum):
    """What becomes of an FSDP1 option that has no FSDP2 counterpart."""

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


# FSDP1 option -> its FSDP2 name, or why it has none
ARGUMENT_KEY_MAPPING: dict[str, Any] = {
    "fsdp_version": "fsdp_version",
    "fsdp_reshard_after_forward": "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy": "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch": ConversionStatus.REMOVED,
    "fsdp_forward_prefetch": ConversionStatus.NOT_YET_IMPLEMENTED,
    "fsdp_cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params": "fsdp_offload_params",
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_state_dict_type": "fsdp_state_dict_type",
    "fsdp_sync_module_states": ConversionStatus.REMOVED,
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "fsdp_min_num_params",
    "fsdp_use_orig_params": ConversionStatus.REMOVED,
    "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
}

# a sharding strategy -> FSDP2's reshard_after_forward (a config written for FSDP1 may hold a strategy name in
# fsdp_reshard_after_forward too); other values are kept as given
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True, "HYBRID_SHARD_ZERO2": False,
            "NO_SHARD": False}
ARGUMENT_VALUE_MAPPING: dict[str, dict[str, bool]] = {
    "fsdp_sharding_strategy": dict(_RESHARD),
    "fsdp_reshard_after_forward": dict(_RESHARD),
}


def convert_config_to_fsdp2(config: dict) -> dict:
    """`config` (an Accelerate config as a mapping) with its `fsdp_config` rewritten for FSDP2; `config` itself is
    updated and returned. A config without FSDP options, or already at fsdp_version 2, is returned unchanged."""
    fsdp_config = config.get("fsdp_config", {})
    if not fsdp_config:
        logger.info("No FSDP config found in the config file, skipping conversion...")
        return config
    if fsdp_config.get("fsdp_version", 1) == 2:
        logger.warning("Config already specifies FSDP2, skipping conversion...")
        logger.warning(
            "If the config doesn't use new argument names, change `fsdp_version` to `1` and rerun the command."
        )
        return config

    converted: dict[str, Any] = {}
    for key, value in fsdp_config.items():
        target = ARGUMENT_KEY_MAPPING.get(key)
        if target is None:  # not an option this command knows: kept as it is
            converted[key] = value
        elif target is ConversionStatus.REMOVED:
            logger.warning(f"Argument {key} has been removed in FSDP2, skipping this key...")
        elif target is ConversionStatus.NOT_YET_IMPLEMENTED:
            logger.warning(f"Argument {key} is not yet implemented in FSDP2, skipping this key...")
        else:
            mapping = ARGUMENT_VALUE_MAPPING.get(key)
            if mapping is not None and isinstance(value, str):
                value = mapping.get(value, value)
            converted[target] = value
    converted["fsdp_version"] = 2
    config["fsdp_config"] = converted
    return config


def to_fsdp2_command_parser(subparsers: Optional[Any] = None) -> argparse.ArgumentParser:
    """The `to-fsdp2` parser: a sub-command of `subparsers` when given (running `to_fsdp2_command`), else its own."""
    description = "Convert an Accelerate config from FSDP1 to FSDP2"
    if subparsers is not None:
        parser = subparsers.add_parser("to-fsdp2", description=description)
    else:
        parser = argparse.ArgumentParser("acc to-fsdp2", description=description)
    parser.add_argument("--config_file", "--config-file", type=str, required=True,
                        help="The config file to convert to FSDP2")
    parser.add_argument("--overwrite", action="store_true", default=False,
                        help="Overwrite the config file if it exists")
    parser.add_argument("--output_file", "--output-file", type=str, default=None,
                        help="The path to the output file to write the converted config to. If not provided, the "
                             "input file will be overwritten (if --overwrite is set)")
    if subparsers is not None:
        parser.set_defaults(func=to_fsdp2_command)
    return parser


def _validate_to_fsdp2_args(args: argparse.Namespace) -> None:
    if not Path(args.config_file).exists():
        raise FileNotFoundError(f"Config file {args.config_file} not found: pass the path of an existing Accelerate "
                                "config file with --config_file")
    if not args.overwrite and args.output_file is None:
        raise ValueError("If --overwrite is not set, --output_file must be provided: pass --output_file PATH to "
                         f"write the converted config there, or --overwrite to replace {args.config_file}")
    if not args.overwrite and Path(args.output_file).exists():
        raise FileExistsError(f"Output file {args.output_file} already exists and --overwrite is not set: pass "
                              "--overwrite to replace it, or another --output_file")


def load_config(config_file: str) -> dict:
    """The mapping in the YAML config file `config_file`; a ValueError when it is empty or not a mapping."""
    with open(config_file, encoding="utf-8") as f:
        config = import_yaml().safe_load(f)
    if not config:
        raise ValueError(f"Config file {config_file} is empty: give a config `accelerate config` wrote")
    if not isinstance(config, dict):
        raise ValueError(f"Config file {config_file} holds a {type(config).__name__}, not a mapping of config keys "
                         "(`key: value` lines, as `accelerate config` writes)")
    return config


def to_fsdp2_command(args: argparse.Namespace) -> None:
    """Convert `args.config_file` and write it to `args.output_file` (the input file itself with --overwrite)."""
    _validate_to_fsdp2_args(args)
    config = load_config(args.config_file)
    if args.overwrite and args.output_file is None:
        args.output_file = args.config_file
    converted = convert_config_to_fsdp2(config)
    yaml = import_yaml()
    with open(args.output_file, "w", encoding="utf-8") as f:
        yaml.safe_dump(converted, f)
