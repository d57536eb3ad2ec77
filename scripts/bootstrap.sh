#!/usr/bin/env bash
# Create or reuse .venv: torch 2.13.0 (CPU), acc-core and the plugins in plugins/ (editable; not xla and not the
# tracker plugins, which have venvs of their own), test tools.
# Re-installs only when a pyproject.toml or this script changed (a stamp file records their hash).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ACC_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
stamp="$venv/.acc-bootstrap"
want="$(cat "$root/pyproject.toml" "$root"/plugins/*/pyproject.toml "$root/scripts/bootstrap.sh" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/acc" ]; then
  exit 0
fi
quiet() { "$@" 2>&1 | { grep -v -e "is ignored: it is neither" -e "^$" || true; }; }
echo "bootstrap: preparing $venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# the CPU build (a plain 'torch' requirement would pull a multi-GB CUDA build)
quiet "${pip[@]}" "torch==2.13.0"
editables=(-e "$root")
for dir in "$root"/plugins/*/; do
  name="$(basename "$dir")"
  # xla pins its own torch and is tested in its own venv (scripts/xla-lane.sh); _template is a skeleton; the
  # tracker plugins depend on their libraries (tensorboard, mlflow, wandb), which are never acc dependencies: they
  # are tested in their own venv (scripts/trackers-venv.sh, built by tests/plugins/trackers); accelerate is the
  # drop-in that takes Hugging Face Accelerate's distribution name, tested in its own venv (tests/dropin)
  case "$name" in xla|_template|tensorboard|mlflow|wandb|accelerate) continue ;; esac
  [ -f "$dir/pyproject.toml" ] && editables+=(-e "$dir")
done
# test tools (hypothesis: the property-based tests of bad input; pyyaml: the tests read Accelerate YAML configs;
# nbclient, ipykernel: the notebook_launcher test executes a real notebook; acc itself depends on none of them), and
# what the examples use (scikit-learn's bundled digits, tqdm progress bars); the linters of scripts/lint.sh, pinned
# (a new release may find new things: upgrading them is a change of its own)
quiet "${pip[@]}" "${editables[@]}" pytest pytest-timeout hypothesis pyyaml nbclient ipykernel numpy safetensors \
  scikit-learn tqdm "ruff==0.17.6" "mypy==2.4.1" "import-linter==2.16"
"$venv/bin/python" -c "import torch, acc; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "$want" > "$stamp"
echo "bootstrap: ready ($("$venv/bin/acc" --version))"
