"""What runs inside each training process, under the facade: the set-up backend and the run's lifecycle, the
collectives, data sharding, the prepared optimizer and scheduler, mixed precision, torch.compile, building models
sharded or on the meta device, and seeding.

`worker` holds the one `Runtime` of a process (the plugin set rebuilt from the launcher's hand-off, the run context,
`acc_setup`); `acc.accelerator.Accelerator` and `acc.state` are views of it. `lifecycle` is how a worker ends,
`tracebacks` how its errors read; `distributed`, `distributed_hooks`, `communicators` and `collectives` the
collectives; `data/` the prepared data loaders and their samplers; `optim`, `precision`, `precision_support`,
`compiling`, `init_module`, `empty_weights`, `seeding`, `prepared`, `ops` the rest of the loop's machinery;
`environment_report` what `acc env` and Accelerate's `env_command` report about this machine.

Imports `acc.contract`, `acc.compat`, `acc.assembly` and `acc.errors`; torch is imported by the modules that need it,
never by this package itself (the launcher imports `lifecycle` and `tracebacks` torch-free).
"""
