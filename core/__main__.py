"""`python -m acc ...` is the `acc` command."""

from acc.cli import main

main()
