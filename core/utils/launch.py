"""Accelerate's `accelerate.utils.launch`: the command and environment Accelerate's launchers compute from a
`launch_command_parser` Namespace (acc.launcher.accelerate_env)."""

from acc.launcher.accelerate_env import (
    PrepareForLaunch,
    _convert_nargs_to_dict,
    _filter_args,
    env_var_path_add,
    prepare_multi_gpu_env,
    prepare_simple_launcher_cmd_env,
)

__all__ = ["PrepareForLaunch", "_convert_nargs_to_dict", "_filter_args", "env_var_path_add", "prepare_multi_gpu_env",
           "prepare_simple_launcher_cmd_env"]
