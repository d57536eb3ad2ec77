#!/usr/bin/env bash
# The whole test suite: lint (scripts/lint.sh: ruff, mypy --strict on the backend SDK), the main lane (.venv:
# torch 2.13, every plugin but xla) and the xla lane (its own venv with torch 2.9 + torch-xla 2.9, cached under
# ~/.cache/acc). Arguments, if any, go to the main lane's
# pytest only (for a quick run of part of it, without lint); without arguments everything runs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
if [ "$#" -gt 0 ]; then
  exec "$root/.venv/bin/python" -m pytest "$@"
fi
echo "== lint"
"$root/scripts/lint.sh"
# the 30 slowest tests are listed at the end, so a run's time can be traced to its tests
"$root/.venv/bin/python" -m pytest --durations=30
echo "== xla lane"
"$root/scripts/xla-lane.sh"
