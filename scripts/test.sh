#!/usr/bin/env bash
# The whole test suite: the main lane (.venv: torch 2.13, every plugin but xla) and the xla lane (its own
# venv with torch 2.9 + torch-xla 2.9, cached under ~/.cache/acc). Arguments, if any, go to the main lane's
# pytest only (for a quick run of part of it); without arguments both lanes run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
if [ "$#" -gt 0 ]; then
  exec "$root/.venv/bin/python" -m pytest "$@"
fi
"$root/.venv/bin/python" -m pytest
echo "== xla lane"
"$root/scripts/xla-lane.sh"
