"""acc's mlflow tracker (entry point `acc.trackers`: mlflow)."""
