#!/usr/bin/env bash
# The benchmarks: `./scripts/bench.sh [--repeats N] [--only NAME ...]` writes bench/results/results.{md,json};
# `./scripts/bench.sh --quick` (under 10 minutes) the sharded-defaults and compile rows, to bench/results/quick.{md,json}.
# The peers acc is compared with (Hugging Face Accelerate, Lightning Fabric) and matplotlib (for the scaling
# plot) go into .venv-bench only: a venv that sees .venv's packages (acc, torch, plugins) and adds its own, so
# they never become acc dependencies.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
if [ "${1:-}" = "--quick" ]; then  # acc's own rows only: no peers to install
  cd "$root"
  exec "$root/.venv/bin/python" bench/run.py "$@"
fi
bench="$root/.venv-bench"
stamp="$bench/.acc-bench"
want="accelerate lightning matplotlib"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bench: preparing $bench"
  rm -rf "$bench"
  "$root/.venv/bin/python" -m venv --without-pip "$bench"
  purelib="$("$bench/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$root/.venv/bin/python" -c 'import site; print("\n".join(f"import site; site.addsitedir({p!r})" for p in site.getsitepackages()))' \
    > "$purelib/_acc_main_venv.pth"
  # torch 2.13.0 is already visible through .venv: pip installs the peers without touching torch
  "$bench/bin/python" -m pip install -q --disable-pip-version-check $want 2>&1 | { grep -v -e "is ignored: it is neither" -e "^$" || true; }
  "$bench/bin/python" -c "import accelerate, lightning, torch; assert torch.__version__.startswith('2.13.0')"
  echo "$want" > "$stamp"
fi
cd "$root"
exec "$bench/bin/python" bench/run.py "$@"
