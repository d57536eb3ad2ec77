"""How a command that ran workers ends: from the console at once, with `os._exit` after flushing its output (the
interpreter's teardown of torch takes about 0.3 s here); under a test runner (click's, pytest) normally.
"""

from __future__ import annotations

import sys

import click

# Set by the console entry point only (not by click's test runner): commands that ran workers may then end
# the launcher with os._exit, skipping the interpreter's teardown of torch (about 0.3 s here).
FAST_EXIT = {"on": False}


def finish(code: int) -> None:
    """End a command that ran workers: at once from the console (output flushed), normally under a test runner."""
    if FAST_EXIT["on"]:
        import logging
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    raise click.exceptions.Exit(code)
