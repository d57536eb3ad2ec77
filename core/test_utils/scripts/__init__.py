"""`acc.test_utils.scripts`: acc's own versions of the programs Accelerate's tests run under `accelerate launch`
(test_script, test_sync, test_ops, test_cli, test_notebook, test_distributed_data_loop, test_merge_weights,
test_ddp_comm_hook). Each checks acc's behaviour where Accelerate's checks Accelerate's, on one process or under
`acc launch --backend ddp --nproc 2`, and exits non-zero when a check fails; `main()` runs them all (what
`debug_launcher(test_script.main)` calls). `external_deps` holds those that need other libraries.

The scripts may import acc's public faces (`acc`, `acc.accelerator`, `acc.state`, `acc.utils`, `acc.data_loader`)
and `acc.test_utils.testing` / `.training`, never the `acc.test_utils` package itself (it imports them) nor
`acc.cli`: a check of a command runs the `acc` executable.
"""
