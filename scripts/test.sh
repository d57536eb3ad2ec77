#!/usr/bin/env bash
# The whole test suite: lint (scripts/lint.sh: ruff, mypy --strict on the contract and the SDKs), the main lane
# (.venv: torch 2.13, every plugin but xla), the xla lane (its own venv with torch 2.9 + torch-xla 2.9, cached under
# ~/.cache/acc), the drop-in lane (tests/dropin: transformers, peft and diffusers on acc's `accelerate` drop-in
# against Hugging Face Accelerate, venvs by scripts/dropin-venv.sh) and the Accelerate-suite lane (Accelerate 1.15's
# own tests on acc: scripts/accelerate-suite.sh).
# Arguments, if any, go to the main lane's
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
"$root/.venv/bin/python" -m pytest --durations=30 --ignore=tests/dropin
echo "== the accelerate drop-in lane (transformers, peft, diffusers on acc against Accelerate 1.15; prints each max difference)"
"$root/.venv/bin/python" -m pytest -q -s --durations=5 tests/dropin
echo "== xla lane"
"$root/scripts/xla-lane.sh"
echo "== Accelerate's own tests on acc (fails when fewer pass than bench/results/accelerate-suite.json records)"
"$root/scripts/accelerate-suite.sh" --check
