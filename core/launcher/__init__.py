"""The `acc launch` process, and `acc.launch(fn)`: from an assembled run to running workers, through an existing
engine, never a home-made one.

`orchestrate` validates the assembly, asks the backend for its plan (`acc_launch_plan`), records the run
(`acc.assembly.manifest`) and hands the plan to the executor of its engine: `elastic` (torch's elastic agent, what
torchrun uses, with `fork` for workers forked from a launcher that imported torch once), `process` (this process
becomes the worker), `pjrt` (torch_xla's spawn). `plans` builds the elastic plan a backend returns, `listen` says
where the rendezvous store listens, `machines` and `preflight` check a launch across machines before and while it
runs, `worker_memory` sets the workers' allocator, `describe` is the dry run's report, and `functions` and
`notebook` launch a function instead of a script (`acc.launch`, `notebook_launcher`, `debug_launcher`).

Torch-free to import (`acc launch --dry-run` never imports torch). Imports the contract, assembly and, inside the
forked worker only, `acc.runtime.lifecycle` and `acc.runtime.tracebacks`.
"""
