#!/usr/bin/env bash
# The main job: set up .venv, then train the quickstart example on the embedded cpu backend and on
# 2 ddp processes (gloo). Each run prints its loss per epoch; the loss falls.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
acc="$root/.venv/bin/acc"
cd "$root"
echo "== acc launch examples/quickstart.py   (cpu backend, 1 process)"
"$acc" launch examples/quickstart.py
echo "== acc launch --backend ddp --nproc 2 examples/quickstart.py"
"$acc" launch --backend ddp --nproc 2 examples/quickstart.py
