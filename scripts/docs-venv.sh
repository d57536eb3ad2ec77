#!/usr/bin/env bash
# The venv of the documentation site (mkdocs.yml; tests/docs): mkdocs, the material theme, mkdocstrings (the API
# reference), mkdocs-click (the CLI reference) and ruff (which formats the reference's signatures), all pinned, with
# acc-core and the plugins that scripts/bootstrap.sh installs (ddp, fsdp, deepspeed, mps, timing, clusters) installed
# editable WITHOUT their dependencies, plus the torch-free ones the build imports (pluggy, click, importlib-metadata,
# packaging): the build imports acc.cli and reads the settings registry (docs/hooks/generate.py), both torch-free, so
# there is no torch here (a bare torch requirement would pull a multi-GB CUDA build). None of this is an acc
# dependency or enters .venv: it lives only here, built once under ~/.cache/acc/docs-venv-<key> and reused while the
# key holds. The key hashes the pins, the python and the recipe; edits of the pyproject.toml files only re-install the
# distributions editable (seconds, no network).
#
#   scripts/docs-venv.sh        # builds (or reuses) the venv; prints its python on the last line
#   $(scripts/docs-venv.sh | tail -n1) -m mkdocs build --strict -d /tmp/site      # from the repository root
#
# An unreachable registry or a failed install is a non-zero exit with the reason, never a quiet skip.
# Env: PYTHON (base interpreter), ACC_CACHE (cache directory, default ~/.cache/acc).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
# ruff: mkdocstrings formats the API reference's signatures with it (the project's lint pin, scripts/bootstrap.sh)
pins=("mkdocs==1.6.1" "mkdocs-material==9.8.1" "mkdocstrings==1.0.8" "mkdocstrings-python==2.0.11"
      "mkdocs-click==0.9.0" "ruff==0.17.6")
# acc-core's torch-free runtime dependencies that importing acc.cli needs (tomli: python < 3.11 only), and the
# build backend of the editable installs (installed here so that re-installs need no network)
deps=("pluggy>=1.5" "click>=8.1" "importlib-metadata>=6" "packaging>=20" "tomli>=2; python_version < '3.11'"
      "setuptools>=68")
recipe=1  # bump when the way the venv is built changes
cache="${ACC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/acc}"
dists=("$root")
for name in ddp fsdp deepspeed mps timing clusters; do dists+=("$root/plugins/$name"); done

fail() {
  echo "docs venv: FAILED: $*" >&2
  exit 1
}
# pip's output without this machine's notes about absent local index folders (its exit status is kept)
quiet() { "$@" 2>&1 | { grep -v -e "is ignored: it is neither" -e "^$" || true; }; }

command -v "$python" >/dev/null || fail "no python interpreter '$python' (set PYTHON)"
py_version="$("$python" -c 'import sys; print(sys.version)')"
projects=()
for d in "${dists[@]}"; do
  [ -f "$d/pyproject.toml" ] || fail "no $d/pyproject.toml"
  projects+=("$d/pyproject.toml")
done
key="$({ echo "recipe $recipe"; printf '%s\n' "${pins[@]}" "${deps[@]}" "$py_version"; } | sha256sum | cut -c1-16)"
editable="$root $(cat "${projects[@]}" | sha256sum | cut -c1-16)"
venv="$cache/docs-venv-$key"
vpy="$venv/bin/python"
pip=("$vpy" -m pip --disable-pip-version-check)
editables=()
for d in "${dists[@]}"; do editables+=(-e "$d"); done

# what the build needs of the venv: checked after a build, and after every editable re-install
check() {
  "$vpy" - <<'PY' >&2
import sys
import mkdocs, material, mkdocstrings, mkdocs_click  # noqa: F401
import acc.cli  # noqa: F401
from acc.assembly.plugins import build_plugin_manager, collect_settings, installed_backends, installed_plugins
for backend in installed_backends():
    collect_settings(build_plugin_manager(backend, list(installed_plugins()) if backend == "cpu" else [])[0])
assert "torch" not in sys.modules, "the docs build imported torch"
print("docs venv: mkdocs", mkdocs.__version__, "with acc-core, backends:", ", ".join(installed_backends()))
PY
}

mkdir -p "$cache"
exec 9>"$cache/docs-venv.lock"
flock 9
if [ ! -f "$venv/.acc-ready" ]; then
  start=$SECONDS
  echo "docs venv: building $venv (${pins[*]})" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv" || fail "could not create the venv $venv"
  if ! quiet "${pip[@]}" install -q --progress-bar off "${pins[@]}" "${deps[@]}" >&2 \
      || ! quiet "${pip[@]}" install -q --progress-bar off --no-deps --no-build-isolation "${editables[@]}" >&2; then
    rm -rf "$venv"
    fail "pip could not install ${pins[*]} with acc-core and the plugins (is the package registry reachable? see pip's output above)"
  fi
  check || { rm -rf "$venv"; fail "the venv $venv does not import what the docs build needs"; }
  echo "$editable" > "$venv/.acc-editable"
  touch "$venv/.acc-ready"
  echo "docs venv: ready in $((SECONDS - start)) s" >&2
elif [ "$(cat "$venv/.acc-editable" 2>/dev/null)" != "$editable" ]; then
  # another clone, or pyproject edits: re-install the editable distributions from this clone (their metadata and
  # entry points), without dependencies or network
  echo "docs venv: reusing $venv, re-installing acc-core and the plugins from $root" >&2
  quiet "${pip[@]}" install -q --no-deps --no-build-isolation "${editables[@]}" >&2 \
    || fail "could not re-install acc-core and the plugins from $root into $venv"
  check || fail "the venv $venv does not import what the docs build needs after re-installing from $root"
  echo "$editable" > "$venv/.acc-editable"
fi
# keep this venv and the one used before it, remove older ones
touch "$venv/.acc-used"
for old in $(for d in "$cache"/docs-venv-*/; do
               [ -d "$d" ] || continue
               d="${d%/}"; [ "$d" = "$venv" ] && continue
               echo "$(stat -c %Y "$d/.acc-used" 2>/dev/null || echo 0) $d"
             done | sort -rn | tail -n +2 | cut -d' ' -f2-); do
  echo "docs venv: removing the older venv $old" >&2
  rm -rf "$old"
done
echo "$vpy"
