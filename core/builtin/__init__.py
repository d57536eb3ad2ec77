"""acc's own plugins, registered the way third-party ones are: the default `cpu` backend (always registered
`trylast`, so it answers every selection hook nobody else answers) and the built-in `jsonl` tracker (found through
the same discovery as installed trackers, `acc.tracking.registry`).

`jsonl` imports only `acc.tracking`, as a third-party tracker does. `cpu` is the kernel's default and ships with it:
it imports the contract, the assembly and the checkpoint files directly. Nothing below this package imports it; the
plugin manager loads `cpu` by its module path.
"""
