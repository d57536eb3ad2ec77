#!/usr/bin/env bash
# The xla test lane. torch-xla 2.9.0 requires torch 2.9.0 (the main lane has torch 2.13), so its tests run
# in a venv of their own: built once under ~/.cache/acc/xla-venv-<key> (outside the clone) and reused while
# the key holds. The key hashes the requirements: the pins, the test tools, the python, and the
# requirements declared in pyproject.toml and plugins/xla/pyproject.toml (dependencies, requires-python,
# build requirements). Other edits of those files (packages, entry points, pytest options) only re-install
# acc-core and acc-xla editable into the cached venv (seconds, no network).
#
#   scripts/xla-lane.sh [PYTEST ARGS...]      # without a test path: tests/plugins/xla
#
# The lane never skips quietly: an unreachable registry, a failed install or a torch_xla that does not
# import is a non-zero exit with a message, and inside the lane (ACC_XLA_LANE=1) the tests that need
# torch_xla fail instead of skipping. Env: PYTHON (base interpreter), ACC_XLA_CACHE (cache directory).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
pins=("torch==2.9.0" "torch-xla==2.9.0")
tools=("pytest>=8" "pytest-timeout>=2" "numpy" "safetensors>=0.4" "setuptools>=68")
recipe=3  # bump when the way the venv is built changes
cache="${ACC_XLA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/acc}"

fail() {
  echo "xla lane: FAILED: $*" >&2
  exit 1
}
# pip's output without this machine's notes about absent local index folders (its exit status is kept)
quiet() { "$@" 2>&1 | { grep -v -e "is ignored: it is neither" -e "^$" || true; }; }

command -v "$python" >/dev/null || fail "no python interpreter '$python' (set PYTHON)"
py_version="$("$python" -c 'import sys; print(sys.version)')"
projects=("$root/pyproject.toml" "$root/plugins/xla/pyproject.toml")
# what each pyproject.toml requires (the whole file where python has no tomllib)
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
key="$({ echo "recipe $recipe"; printf '%s\n' "${pins[@]}" "${tools[@]}" "$py_version" "$requirements"; } \
       | sha256sum | cut -c1-16)"
# the editable installs are refreshed when the clone or anything else in the two files changes
editable="$root $(cat "${projects[@]}" | sha256sum | cut -c1-16)"
venv="$cache/xla-venv-$key"
vpy="$venv/bin/python"
pip=("$vpy" -m pip --disable-pip-version-check)

mkdir -p "$cache"
exec 9>"$cache/xla-venv.lock"
# one lane at a time per cache: the venv's editable installs point at one clone while its tests run
flock 9

if [ ! -f "$venv/.acc-ready" ]; then
  start=$SECONDS
  echo "xla lane: building $venv (${pins[*]}; torch 2.9.0 is a multi-GB download, a few minutes, once)"
  rm -rf "$venv"
  "$python" -m venv "$venv" || fail "could not create the venv $venv"
  # fail loudly, never skip, when the registry cannot be reached
  if ! index="$("${pip[@]}" index versions torch-xla --timeout 30 --retries 2 2>&1)" \
      || ! grep -q "2\.9\.0" <<<"$index"; then
    rm -rf "$venv"
    fail "the package registry is unreachable or has no torch-xla 2.9.0, so the xla lane cannot be built:
$index"
  fi
  # one resolver run: the pins, acc-core (whose torch range must admit 2.9) and acc-xla, the test tools
  if ! quiet "${pip[@]}" install -q --progress-bar off "${pins[@]}" "${tools[@]}" -e "$root" -e "$root/plugins/xla"; then
    rm -rf "$venv"
    fail "pip could not install ${pins[*]} with acc-core and acc-xla (see pip's output above)"
  fi
  quiet "${pip[@]}" check || fail "the lane venv $venv has inconsistent requirements (pip check above)"
  echo "$editable" > "$venv/.acc-editable"
  touch "$venv/.acc-ready"
  echo "xla lane: venv ready in $((SECONDS - start)) s"
elif [ "$(cat "$venv/.acc-editable" 2>/dev/null)" != "$editable" ]; then
  # another clone, or pyproject edits that need no new requirement: re-install acc-core and acc-xla
  # editable from this clone (their metadata and entry points), without dependencies or network
  echo "xla lane: reusing $venv, re-installing acc-core and acc-xla from $root"
  quiet "${pip[@]}" install -q --no-deps --no-build-isolation -e "$root" -e "$root/plugins/xla" \
    || fail "could not re-install acc-core/acc-xla from $root into $venv"
  echo "$editable" > "$venv/.acc-editable"
else
  echo "xla lane: reusing $venv"
fi

out="$(PJRT_DEVICE=CPU "$vpy" -c 'import torch, torch_xla, acc; print(torch.__version__, torch_xla.__version__)' 2>&1)" \
  || fail "torch_xla does not import in $venv (delete the venv to rebuild it):
$out"
versions="$(tail -n 1 <<<"$out")"
case "$versions" in
  2.9.0*" "2.9.0*) ;;
  *) fail "expected torch 2.9.0 and torch-xla 2.9.0 in $venv, found: $versions" ;;
esac
echo "xla lane: torch / torch-xla $versions, PJRT_DEVICE=CPU"

# each venv is ~7 GB: keep this one and the one used before it, remove older ones
touch "$venv/.acc-used"
for old in $(for d in "$cache"/xla-venv-*/; do
               d="${d%/}"; [ "$d" = "$venv" ] && continue
               echo "$(stat -c %Y "$d/.acc-used" 2>/dev/null || echo 0) $d"
             done | sort -rn | tail -n +2 | cut -d' ' -f2-); do
  echo "xla lane: removing the older lane venv $old"
  rm -rf "$old"
done

cd "$root"
export PJRT_DEVICE=CPU ACC_XLA_LANE=1
unset XLA_USE_BF16 XLA_DOWNCAST_BF16 TPU_NUM_DEVICES CPU_NUM_DEVICES || true
has_path=0  # pytest arguments without a test path run the xla tests
for arg in "$@"; do
  [ -e "${arg%%::*}" ] && has_path=1
done
[ "$has_path" = 1 ] || set -- "$@" tests/plugins/xla
exec "$vpy" -m pytest "$@"
