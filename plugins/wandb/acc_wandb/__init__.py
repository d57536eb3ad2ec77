"""acc's wandb tracker (entry point `acc.trackers`: wandb)."""
