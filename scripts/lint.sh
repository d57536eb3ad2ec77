#!/usr/bin/env bash
# Static checks, run by scripts/test.sh before the tests (and on their own: scripts/lint.sh):
# - ruff on everything (ruff.toml: pyflakes' errors, pycodestyle's import/statement/syntax errors);
# - mypy --strict on the backend SDK: the modules a backend, tracker or cluster-environment author imports
#   (acc.backend and what it re-exports by name, the contract's hook specs, acc.assembly.clusters). The rest of the
#   kernel is type-hinted on its public functions but not yet held to mypy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ACC_VENV:-$root/.venv}"
cd "$root"
sdk=(core/backend.py core/contract/hookspecs.py core/contract/communicator.py core/contract/capabilities.py core/contract/context.py core/contract/enums.py
     core/errors.py core/contract/launch_plan.py core/assembly/clusters.py)
"$venv/bin/ruff" check --quiet .
"$venv/bin/mypy" --strict --follow-imports=silent --ignore-missing-imports --no-error-summary "${sdk[@]}"
echo "lint: ruff clean; mypy --strict clean on the SDK (${#sdk[@]} modules)"
