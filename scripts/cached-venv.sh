#!/usr/bin/env bash
# A test-only venv, built once under ~/.cache/acc/<name>-<key> and reused while its key holds (key: the recipe, the
# pins, the editable sources' pyproject.toml files and the python). Never an acc dependency: it lives only there.
#
#   scripts/cached-venv.sh NAME [-e DIR ...] -- PIN [PIN ...]      # prints the venv's python on the last line
#
# torch is installed first and alone when a pin names it, so pip takes the CPU build this machine keeps on disk.
# `-e DIR` installs DIR editable after the pins (acc-core, its plugins). An unreachable registry or a failed install
# is a non-zero exit with the reason, never a quiet skip. Env: PYTHON (base interpreter), ACC_CACHE (cache directory).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${1:?usage: cached-venv.sh NAME [-e DIR ...] -- PIN ...}"
shift
editables=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  [ "$1" = "-e" ] || { echo "cached-venv: expected -e DIR or --, got '$1'" >&2; exit 2; }
  editables+=("$(cd "$2" && pwd)")
  shift 2
done
[ "${1:-}" = "--" ] && shift
pins=("$@")
[ "${#pins[@]}" -gt 0 ] || { echo "cached-venv: no pins given" >&2; exit 2; }
python="${PYTHON:-python3}"
recipe=1  # bump when the way the venvs are built changes
cache="${ACC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/acc}"

fail() {
  echo "$name venv: FAILED: $*" >&2
  exit 1
}
quiet() { "$@" 2>&1 | { grep -v -e "is ignored: it is neither" -e "^$" || true; }; }

command -v "$python" >/dev/null || fail "no python interpreter '$python' (set PYTHON)"
py_version="$("$python" -c 'import sys; print(sys.version)')"
key="$({ echo "recipe $recipe"; printf '%s\n' "${pins[@]}" "$py_version";
         for dir in "${editables[@]}"; do echo "$dir"; cat "$dir/pyproject.toml"; done; } | sha256sum | cut -c1-16)"
venv="$cache/$name-$key"
vpy="$venv/bin/python"
pip=("$vpy" -m pip install -q --disable-pip-version-check --progress-bar off)

mkdir -p "$cache"
exec 9>"$cache/$name.lock"
flock 9
if [ ! -f "$venv/.acc-ready" ]; then
  start=$SECONDS
  echo "$name venv: building $venv (${pins[*]})" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv" || fail "could not create the venv $venv"
  torch=()
  for pin in "${pins[@]}"; do
    case "$pin" in torch==*) torch=("$pin") ;; esac
  done
  if { [ "${#torch[@]}" -gt 0 ] && ! quiet "${pip[@]}" "${torch[@]}" >&2; } \
      || ! quiet "${pip[@]}" "${pins[@]}" >&2 \
      || { [ "${#editables[@]}" -gt 0 ] && ! quiet "${pip[@]}" $(printf -- '-e %s ' "${editables[@]}") >&2; }; then
    rm -rf "$venv"
    fail "pip could not install ${pins[*]} ${editables[*]} (is the package registry reachable? see pip's output above)"
  fi
  touch "$venv/.acc-ready"
  echo "$name venv: ready in $((SECONDS - start)) s" >&2
fi
echo "$vpy"
