"""acc-timing: a cross-cutting acc plugin (entry point `timing` in `acc.plugins`); enable with `-p timing`."""

__version__ = "0.1.0"
