#!/usr/bin/env bash
# The Accelerate-suite lane: Accelerate 1.15's own unit tests on Accelerate and on acc, "N of B" and a table per file
# (scripts/accelerate_suite.py says how the tests are rewritten and run). Two cached test venvs with the same pins,
# one with accelerate==1.15.0, one with acc-core and its plugins (editable), and one with acc plus datasets and
# evaluate for Accelerate's test scripts; never acc dependencies.
#
#   scripts/accelerate-suite.sh            # run both, print the table and "N of B"
#   scripts/accelerate-suite.sh --record   # also write bench/results/accelerate-suite.{json,md}
#   scripts/accelerate-suite.sh --check    # fail when fewer pass on acc than recorded (scripts/test.sh runs this)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
pins=(torch==2.13.0 pytest==9.2.0 pytest-timeout==2.4.0 parameterized==0.9.0 transformers==5.23.0 numpy==2.4.6
      pyyaml==6.0.4 psutil==7.2.2 safetensors==0.8.0)
base="$(scripts/cached-venv.sh accsuite-accelerate -- "${pins[@]}" accelerate==1.15.0 | tail -n 1)"
acc="$(scripts/cached-venv.sh accsuite-acc -e . -e plugins/ddp -e plugins/fsdp -e plugins/deepspeed -e plugins/mps \
        -e plugins/clusters -e plugins/timing -- "${pins[@]}" | tail -n 1)"
# Accelerate's test scripts (test_metrics imports datasets and evaluate): acc in a third venv with those too
scripts="$(scripts/cached-venv.sh accsuite-scripts -e . -e plugins/ddp -- "${pins[@]}" datasets==5.2.0 evaluate==0.4.6 \
           | tail -n 1)"
exec "$base" scripts/accelerate_suite.py --base-python "$base" --acc-python "$acc" --scripts-python "$scripts" "$@"
