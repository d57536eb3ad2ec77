"""acc's tensorboard tracker (entry point `acc.trackers`: tensorboard)."""
