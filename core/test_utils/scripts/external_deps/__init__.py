"""`acc.test_utils.scripts.external_deps`: acc's versions of Accelerate's test programs that need libraries acc does
not depend on: test_metrics (gather_for_metrics; its MRPC part needs datasets, evaluate and transformers, and runs
on an accelerator only) and test_pippy (pipeline-parallel inference, which acc does not have: it says so and exits
non-zero).

Like the other scripts they may import acc's public faces and `acc.test_utils.testing` / `.training`, and the
external libraries only inside the checks that use them; never `acc.cli`.
"""
