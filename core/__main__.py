"""`python -m acc ...` is the `acc` command."""

from .cli import main

main()
