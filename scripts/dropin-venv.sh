#!/usr/bin/env bash
# The venvs of the drop-in lane (tests/dropin): transformers, peft, diffusers and DeepSpeed on acc's `accelerate`
# drop-in (plugins/accelerate), and the same pins on Hugging Face Accelerate 1.15 for the differential (Accelerate
# runs DeepSpeed on its CPU accelerator too). Built once each under ~/.cache/acc (keyed by the pins and the editable
# sources' pyproject.toml) by scripts/cached-venv.sh; never acc dependencies.
#
#   scripts/dropin-venv.sh acc|accelerate      # prints the venv's python on the last line
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
pins=(torch==2.13.0 transformers==5.23.0 numpy==2.4.6 safetensors==0.8.0 deepspeed==0.19.8 peft==0.21.2
      diffusers==0.42.1)
case "${1:-}" in
  acc) exec scripts/cached-venv.sh dropin -e . -e plugins/ddp -e plugins/fsdp -e plugins/deepspeed -e plugins/accelerate \
         -- "${pins[@]}" ;;
  accelerate) exec scripts/cached-venv.sh dropin-reference -- "${pins[@]}" accelerate==1.15.0 ;;
  *) echo "usage: scripts/dropin-venv.sh acc|accelerate (got '${1:-}')" >&2; exit 2 ;;
esac
