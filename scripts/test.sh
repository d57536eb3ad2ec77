#!/usr/bin/env bash
# The whole test suite: set up .venv, then run pytest (extra arguments go to pytest).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
"$root/.venv/bin/python" -m pytest "$@"
