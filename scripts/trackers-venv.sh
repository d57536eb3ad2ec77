#!/usr/bin/env bash
# The venv of the tracker tests (tests/plugins/trackers): torch 2.13.0 (CPU), the trackers' own libraries
# (tensorboard, mlflow, wandb) and matplotlib (acc plot), with acc-core, acc-ddp and the tracker plugins
# acc-tensorboard, acc-mlflow, acc-wandb installed editable. Those libraries are never acc dependencies and never
# enter .venv: they live only here, built once under ~/.cache/acc/trackers-venv-<key> and reused while the key
# holds. The key hashes the pins, the python, and the requirements declared in the pyproject.toml files of the
# distributions installed editable (dependencies, requires-python, build requirements); other edits of those
# files (entry points, packages) only re-install them editable into the cached venv (seconds, no network).
#
#   scripts/trackers-venv.sh        # builds (or reuses) the venv; prints its python on the last line
#
# An unreachable registry or a failed install is a non-zero exit with the reason, never a quiet skip.
# Env: PYTHON (base interpreter), ACC_CACHE (cache directory, default ~/.cache/acc).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
torch_pin="torch==2.13.0"
pins=("tensorboard==2.21.0" "mlflow==3.17.2" "wandb==0.31.0" "matplotlib==3.11.2" "numpy")
recipe=1  # bump when the way the venv is built changes
cache="${ACC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/acc}"
dists=("$root" "$root/plugins/ddp" "$root/plugins/tensorboard" "$root/plugins/mlflow" "$root/plugins/wandb")

fail() {
  echo "trackers venv: FAILED: $*" >&2
  exit 1
}
# pip's output without this machine's notes about absent local index folders (its exit status is kept)
quiet() { "$@" 2>&1 | { grep -v -e "is ignored: it is neither" -e "^$" || true; }; }

command -v "$python" >/dev/null || fail "no python interpreter '$python' (set PYTHON)"
py_version="$("$python" -c 'import sys; print(sys.version)')"
projects=()
for d in "${dists[@]}"; do projects+=("$d/pyproject.toml"); done
requirements="$("$python" - "${projects[@]}" <<'PY'
import json, sys
try:
    import tomllib
except ImportError:
    sys.stdout.write("".join(open(path).read() for path in sys.argv[1:]))
    raise SystemExit
for path in sys.argv[1:]:
    with open(path, "rb") as fp:
        data = tomllib.load(fp)
    project = data.get("project", {})
    print(json.dumps([project.get("name"), project.get("requires-python"), project.get("dependencies"),
                      data.get("build-system", {}).get("requires")]))
PY
)" || fail "could not read the requirements in ${projects[*]}"
key="$({ echo "recipe $recipe"; printf '%s\n' "$torch_pin" "${pins[@]}" "$py_version" "$requirements"; } \
       | sha256sum | cut -c1-16)"
editable="$root $(cat "${projects[@]}" | sha256sum | cut -c1-16)"
venv="$cache/trackers-venv-$key"
vpy="$venv/bin/python"
pip=("$vpy" -m pip --disable-pip-version-check)
editables=()
for d in "${dists[@]}"; do editables+=(-e "$d"); done

mkdir -p "$cache"
exec 9>"$cache/trackers-venv.lock"
flock 9
if [ ! -f "$venv/.acc-ready" ]; then
  start=$SECONDS
  echo "trackers venv: building $venv ($torch_pin ${pins[*]})" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv" || fail "could not create the venv $venv"
  # torch first, alone: pip then takes the CPU build this machine keeps on disk; then one resolver run for the
  # trackers' libraries and the editable distributions
  if ! quiet "${pip[@]}" install -q --progress-bar off "$torch_pin" >&2 \
      || ! quiet "${pip[@]}" install -q --progress-bar off "$torch_pin" "${pins[@]}" "${editables[@]}" >&2; then
    rm -rf "$venv"
    fail "pip could not install $torch_pin ${pins[*]} with acc-core and the tracker plugins (is the package registry reachable? see pip's output above)"
  fi
  "$vpy" - <<'PY' >&2 || { rm -rf "$venv"; fail "the venv $venv does not import what the tracker tests need"; }
import torch, tensorboard, mlflow, wandb, matplotlib, acc, acc_ddp, acc_tensorboard, acc_mlflow, acc_wandb
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("trackers venv: torch", torch.__version__, "tensorboard", tensorboard.__version__, "mlflow", mlflow.__version__,
      "wandb", wandb.__version__, "matplotlib", matplotlib.__version__)
PY
  echo "$editable" > "$venv/.acc-editable"
  touch "$venv/.acc-ready"
  echo "trackers venv: ready in $((SECONDS - start)) s" >&2
elif [ "$(cat "$venv/.acc-editable" 2>/dev/null)" != "$editable" ]; then
  # another clone, or pyproject edits that need no new requirement: re-install the editable distributions
  # from this clone (their metadata and entry points), without dependencies or network
  echo "trackers venv: reusing $venv, re-installing acc-core and the plugins from $root" >&2
  quiet "${pip[@]}" install -q --no-deps --no-build-isolation "${editables[@]}" >&2 \
    || fail "could not re-install acc-core and the tracker plugins from $root into $venv"
  echo "$editable" > "$venv/.acc-editable"
fi
# each venv is a few GB: keep this one and the one used before it, remove older ones
touch "$venv/.acc-used"
for old in $(for d in "$cache"/trackers-venv-*/; do
               d="${d%/}"; [ "$d" = "$venv" ] && continue
               echo "$(stat -c %Y "$d/.acc-used" 2>/dev/null || echo 0) $d"
             done | sort -rn | tail -n +2 | cut -d' ' -f2-); do
  echo "trackers venv: removing the older venv $old" >&2
  rm -rf "$old"
done
echo "$vpy"
