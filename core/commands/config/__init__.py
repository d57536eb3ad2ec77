"""`acc.commands.config`: Accelerate's `accelerate.commands.config`: `config_args` (the config-file classes
`BaseConfig`, `ClusterConfig`, `SageMakerConfig`, `load_config_from_file` and the default file's path), read and
written as Accelerate reads and writes them, so a config file made for `accelerate launch` serves `acc launch`.

It may import `acc.compat` (where acc reads Accelerate's config keys), `acc.assembly` and `acc.contract`; it never
imports `acc.cli` or torch.
"""

from acc.commands.config.config_args import default_config_file, load_config_from_file

__all__ = ["default_config_file", "load_config_from_file"]
