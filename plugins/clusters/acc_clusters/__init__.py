"""acc's cluster environments: one plugin module per scheduler (entry-point group `acc.clusters`). Torch-free."""
