"""`acc.commands`: Accelerate's `accelerate.commands` for acc: the argparse parsers and command functions that
scripts and Accelerate's own tests call (`launch_command_parser`, `launch_command`, `env_command`, `test_command`,
`estimate_command`, `to_fsdp2_command`, `tpu_command_launcher`, `config.config_args`), each running acc's machinery.

acc's own command line is `acc.cli` (click), which sits above this package; these modules never import it: a
command that starts processes runs the `acc` executable. They may import acc's public faces and every role
package below them (`acc.launcher`, `acc.assembly`, `acc.compat`, ...). Importing one does not import torch.
"""
