"""Accelerate's `accelerate.commands.merge` for acc: `merge_command_parser` and `merge_command` (Accelerate's
`accelerate merge-weights CHECKPOINT_DIRECTORY OUTPUT_PATH [--unsafe_serialization] [--remove_checkpoint_dir]`),
running `acc.utils.merge_fsdp_weights`, the code of `acc merge-weights`. Importing it does not import torch.
"""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = ("Merge the model weights of a checkpoint saved on a sharding backend (acc save_state on fsdp) into one "
               "weights file under OUTPUT_PATH (model.safetensors, or pytorch_model.bin with --unsafe_serialization).")


def merge_command(args: argparse.Namespace) -> Any:
    from acc.utils.fsdp_utils import merge_fsdp_weights

    return merge_fsdp_weights(args.checkpoint_directory, args.output_path, not args.unsafe_serialization,
                              args.remove_checkpoint_dir)


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of `merge-weights` (a sub-parser of `subparsers` when given, whose default `func` is
    `merge_command`)."""
    if subparsers is not None:
        parser = subparsers.add_parser("merge-weights", description=DESCRIPTION)
    else:
        parser = argparse.ArgumentParser("acc merge-weights", description=DESCRIPTION)
    parser.add_argument("checkpoint_directory", type=str, help="the checkpoint directory (save_state on fsdp)")
    parser.add_argument("output_path", type=str, help="the directory the merged weights file is written to")
    parser.add_argument("--unsafe_serialization", "--unsafe-serialization", action="store_true", default=False,
                        help="write pytorch_model.bin (a torch file) instead of model.safetensors")
    parser.add_argument("--remove_checkpoint_dir", "--remove-checkpoint-dir", action="store_true", default=False,
                        help="delete the checkpoint directory after merging")
    if subparsers is not None:
        parser.set_defaults(func=merge_command)
    return parser


def main() -> None:
    merge_command(merge_command_parser().parse_args())


__all__ = ["merge_command", "merge_command_parser"]
