"""Accelerate's `accelerate.utils.environment`: environment-variable helpers (acc's own objects,
`acc.compat.environment`). Torch-free."""

from acc.compat.environment import (  # noqa: F401
    are_libraries_initialized,
    clear_environment,
    convert_dict_to_env_variables,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    str_to_bool,
)

__all__ = ['are_libraries_initialized', 'clear_environment', 'convert_dict_to_env_variables', 'get_int_from_env', 'parse_choice_from_env', 'parse_flag_from_env', 'patch_environment', 'purge_accelerate_environment', 'str_to_bool']
