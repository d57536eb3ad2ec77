#!/usr/bin/env bash
# Static checks, run by scripts/test.sh before the tests (and on their own: scripts/lint.sh):
# - ruff on everything (ruff.toml says which rules and why);
# - mypy --strict on the contract and the public SDKs: `acc.contract` (the hook specs and the data that crosses them),
#   `acc.backend` (what a backend imports), `acc.cluster` (a cluster environment), `acc.tracking` with its base class
#   and values (a tracker), `acc.errors`, and the SDK's code they hand on (the launch plans, the clusters' side, the
#   communicators). mypy reads them as the package `acc` (core/ seen through a link named acc), so their imports of
#   each other are type-checked, not taken as Any. The rest of the kernel is type-hinted on its public functions but
#   not yet held to mypy.
# The import-layer contract (pyproject.toml [tool.importlinter]) is a test: tests/core/test_layout.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ACC_VENV:-$root/.venv}"
cd "$root"
"$venv/bin/ruff" check --quiet .
view="$(mktemp -d)"
trap 'rm -rf "$view"' EXIT
ln -s "$root/core" "$view/acc"
sdk=(-p acc.contract -m acc.backend -m acc.cluster -m acc.errors -m acc.tracking -m acc.tracking.base
     -m acc.tracking.values -m acc.launcher.plans -m acc.assembly.clusters -m acc.runtime.communicators)
(cd "$view" && MYPYPATH="$view" "$venv/bin/mypy" --strict --follow-imports=silent --ignore-missing-imports \
  --no-error-summary --cache-dir "$view/.mypy_cache" "${sdk[@]}")
echo "lint: ruff clean; mypy --strict clean on the contract and the SDKs"
