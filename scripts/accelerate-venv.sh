#!/usr/bin/env bash
# The reference venv of the differential tests (tests/differential): Hugging Face Accelerate 1.15 on the same
# torch as the main lane, so one script can be run with Accelerate and with acc and the results compared.
# Accelerate is never an acc dependency: it lives only here, built once under
# ~/.cache/acc/accelerate-venv-<key> (key: the pins, the python) and reused while the key holds.
#
#   scripts/accelerate-venv.sh        # builds (or reuses) the venv; prints its python on the last line
#
# An unreachable registry or a failed install is a non-zero exit with the reason, never a quiet skip.
# Env: PYTHON (base interpreter), ACC_CACHE (cache directory, default ~/.cache/acc).
set -euo pipefail
python="${PYTHON:-python3}"
pins=("torch==2.13.0" "accelerate==1.15.0" "numpy")
recipe=1  # bump when the way the venv is built changes
cache="${ACC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/acc}"

fail() {
  echo "accelerate venv: FAILED: $*" >&2
  exit 1
}
quiet() { "$@" 2>&1 | { grep -v -e "is ignored: it is neither" -e "^$" || true; }; }

command -v "$python" >/dev/null || fail "no python interpreter '$python' (set PYTHON)"
py_version="$("$python" -c 'import sys; print(sys.version)')"
key="$({ echo "recipe $recipe"; printf '%s\n' "${pins[@]}" "$py_version"; } | sha256sum | cut -c1-16)"
venv="$cache/accelerate-venv-$key"
vpy="$venv/bin/python"

mkdir -p "$cache"
exec 9>"$cache/accelerate-venv.lock"
flock 9
if [ ! -f "$venv/.acc-ready" ]; then
  start=$SECONDS
  echo "accelerate venv: building $venv (${pins[*]})" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv" || fail "could not create the venv $venv"
  # torch first, alone: pip then takes the CPU build this machine keeps on disk
  if ! quiet "$vpy" -m pip install -q --disable-pip-version-check --progress-bar off "${pins[0]}" >&2 \
      || ! quiet "$vpy" -m pip install -q --disable-pip-version-check --progress-bar off "${pins[@]}" >&2; then
    rm -rf "$venv"
    fail "pip could not install ${pins[*]} (is the package registry reachable? see pip's output above)"
  fi
  "$vpy" -c 'import accelerate, torch; assert accelerate.__version__ == "1.15.0" and torch.__version__.startswith("2.13.0")' \
    || { rm -rf "$venv"; fail "the venv $venv does not hold accelerate 1.15.0 on torch 2.13.0"; }
  touch "$venv/.acc-ready"
  echo "accelerate venv: ready in $((SECONDS - start)) s" >&2
fi
echo "$vpy"
