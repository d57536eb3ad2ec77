#!/usr/bin/env bash
# GPU readiness in one command (about 3-5 minutes on one GPU; bounded at 8): `acc check` on CUDA for the backends
# cpu, ddp, fsdp and deepspeed (one process each) with fp32, bf16 and fp16, each under its own timeout; the suite's
# CUDA tests (`pytest -m cuda`); the sharded memory rows (peak CUDA memory per rank of fsdp and ZeRO-3 against ddp,
# bench/workloads/sharded_step.py, 2 processes) and context parallel (cp 2 on fsdp against one process,
# tests/workers/context_parallel.py) when there are 2+ GPUs. Then it prints one table (backend x
# precision: pass/fail, seconds, the mixed/fp32 step-time ratio acc check measured, the first line of the error) and
# writes it, with every log, to $ACC_GPU_CHECK_DIR (default: a new /tmp/acc-gpu-check.* directory).
#
# What it needs: this checkout and a Python whose torch sees a CUDA device (torch>=2.9,<2.14, a CUDA build). It looks,
# in this order, at $ACC_GPU_PYTHON; .venv/bin/python; `python3` on PATH (e.g. an image's own CUDA torch: then acc
# and its plugins are installed, editable and without dependencies, into an overlay venv, $ACC_GPU_VENV, default
# ~/.cache/acc/gpu-venv, that sees that python's packages); and when .venv is missing, scripts/bootstrap.sh makes it
# (`torch==2.13.0` from the configured index: the CUDA build from PyPI on Linux x86-64, the CPU build where the index
# serves that, as this project's CI does). acc's own dependencies missing from that python (blake3,
# importlib-metadata, deepspeed, ...) are installed from wheels in $ACC_GPU_WHEELS (default .whl/ in the checkout)
# when it exists, else from the package index. A machine without network gets those wheels carried over:
# `scripts/gpu-check.sh --download-wheels` (on a machine with pip access) saves them to .whl/ for Python
# $ACC_GPU_PY_VERSION (default 3.12) on manylinux x86-64.
#
# Without a CUDA device it exits 2 with one line saying so. Exit 1: some check failed; 0: all passed.
# Settings: ACC_GPU_CHECK_TIMEOUT (seconds per acc check, default 90), ACC_GPU_CHECK_BUDGET (seconds for all the
# acc checks, default 360; rows after it are "not run"), ACC_GPU_CHECK_BACKENDS, ACC_GPU_CHECK_PRECISIONS;
# ACC_GPU_CHECK_FAKE_CUDA=1 runs everything on the CPU instead (tests of this script on a machine without a GPU).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheels="${ACC_GPU_WHEELS:-$root/.whl}"
# acc-core's and acc-deepspeed's requirements that an image with torch may lack (deepspeed's own: hjson, pydantic)
EXTRA_REQS=(blake3 importlib-metadata lazy-importer deepspeed hjson pydantic pydantic-core annotated-types
            typing-inspection)

if [ "${1:-}" = "--download-wheels" ]; then
  py="${ACC_GPU_PY_VERSION:-3.12}"
  pins=()
  for name in "${EXTRA_REQS[@]}"; do  # the versions this checkout's .venv was tested with, when it has them
    v="$("$root/.venv/bin/python" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')"
    pins+=("$name${v:+==$v}")
  done
  mkdir -p "$wheels"
  if [ "$wheels" = "$root/.whl" ] && [ -d "$root/.git/info" ]; then  # carried, never committed
    grep -qx '/.whl/' "$root/.git/info/exclude" 2>/dev/null || echo '/.whl/' >> "$root/.git/info/exclude"
  fi
  plats=()
  for n in 17 24 27 28 31 34 35; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
  for pin in "${pins[@]}"; do  # one at a time: a pure-Python sdist-only package (hjson, deepspeed) needs its own call
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
      "${plats[@]}" --platform manylinux2014_x86_64 --platform any -d "$wheels" "$pin" 2>/dev/null ||
      python3 -m pip download -q --no-deps -d "$wheels" "$pin" ||
      { echo "gpu-check: could not download $pin"; exit 1; }
  done
  echo "gpu-check: wheels for Python $py in $wheels ($(ls "$wheels" | wc -l) files)"
  exit 0
fi

# -- a Python whose torch sees a CUDA device
DESCRIBE='import torch; c = torch.version.cuda or "none"; n = torch.cuda.is_available()
print(f"torch {torch.__version__} (CUDA build {c}), torch.cuda.is_available() = {n}")'
describe() { "$1" -c "$DESCRIBE" 2>/dev/null || echo "no torch"; }
has_cuda() {  # ACC_GPU_CHECK_FAKE_CUDA=1 takes the CPU for one (to test this script on a machine without a GPU)
  local probe='import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'
  [ "${ACC_GPU_CHECK_FAKE_CUDA:-0}" = 1 ] && probe='import torch'
  "$1" -c "$probe" >/dev/null 2>&1
}
seen=()
python=""
if [ -n "${ACC_GPU_PYTHON:-}" ]; then
  has_cuda "$ACC_GPU_PYTHON" && python="$ACC_GPU_PYTHON"
  seen+=("$ACC_GPU_PYTHON: $(describe "$ACC_GPU_PYTHON")")
else
  if [ ! -x "$root/.venv/bin/python" ] && ! { command -v python3 >/dev/null && has_cuda python3; }; then
    "$root/scripts/bootstrap.sh" >&2 || echo "gpu-check: scripts/bootstrap.sh failed; looking further" >&2
  fi
  if [ -x "$root/.venv/bin/python" ]; then
    if has_cuda "$root/.venv/bin/python"; then python="$root/.venv/bin/python"; fi
    seen+=(".venv/bin/python: $(describe "$root/.venv/bin/python")")
  fi
  if [ -z "$python" ] && command -v python3 >/dev/null; then
    if has_cuda python3; then python="$(command -v python3)"; fi
    seen+=("python3 ($(command -v python3)): $(describe python3)")
  fi
fi
if [ -z "$python" ]; then
  joined="$(printf '%s; ' "${seen[@]}")"
  echo "gpu-check: no CUDA device: ${joined%; } - run this on a machine with an NVIDIA GPU and a CUDA build of torch" >&2
  exit 2
fi

# -- acc installed for that Python
if [ "$python" != "$root/.venv/bin/python" ] || [ ! -x "$root/.venv/bin/acc" ]; then
  venv="${ACC_GPU_VENV:-$HOME/.cache/acc/gpu-venv}"
  if [ ! -x "$venv/bin/python" ]; then
    echo "gpu-check: making $venv over $python"
    "$python" -m venv --without-pip "$venv" || exit 1  # pip and setuptools: the parent's (no older copies)
    purelib="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$python" -c 'import site; print("".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages()))' \
      > "$purelib/_acc_parent_python.pth"
  fi
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation)
  missing=()
  for name in "${EXTRA_REQS[@]}"; do
    "$venv/bin/python" -m pip show -q "$name" >/dev/null 2>&1 || missing+=("$name")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ -d "$wheels" ]; then
      files=()
      for name in "${missing[@]}"; do
        pattern="$(echo "$name" | tr '-' '_')"
        for f in "$wheels"/*; do
          base="$(basename "$f" | tr '-' '_' | tr 'A-Z' 'a-z')"
          case "$base" in "${pattern}"_[0-9]*) files+=("$f") ;; esac
        done
      done
      [ "${#files[@]}" -gt 0 ] && "${pip[@]}" --no-index "${files[@]}"
    else
      "$venv/bin/python" -m pip install -q --disable-pip-version-check "${missing[@]}" ||
        echo "gpu-check: could not install ${missing[*]} (no network? see --download-wheels)"
    fi
  fi
  editables=(-e "$root")
  for dir in "$root"/plugins/*/; do
    case "$(basename "$dir")" in xla|_template|tensorboard|mlflow|wandb|mps) continue ;; esac
    editables+=(-e "$dir")
  done
  "$venv/bin/python" -c 'import acc' 2>/dev/null && [ -x "$venv/bin/acc" ] && [ "${ACC_GPU_REINSTALL:-0}" = 0 ] ||
    "${pip[@]}" "${editables[@]}" || { echo "gpu-check: installing acc into $venv failed"; exit 1; }
  python="$venv/bin/python"
fi
acc="$(dirname "$python")/acc"
dir="${ACC_GPU_CHECK_DIR:-$(mktemp -d /tmp/acc-gpu-check.XXXXXX)}"
mkdir -p "$dir"
per_check="${ACC_GPU_CHECK_TIMEOUT:-90}"
budget="${ACC_GPU_CHECK_BUDGET:-360}"
read -r -a backends <<< "${ACC_GPU_CHECK_BACKENDS:-cpu ddp fsdp deepspeed}"
read -r -a precisions <<< "${ACC_GPU_CHECK_PRECISIONS:-no bf16 fp16}"
gpus="$("$python" -c 'import torch; print(torch.cuda.device_count())')"
{
  echo "gpu-check: $(describe "$python"); $gpus GPU(s): $("$python" -c 'import torch; print(", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))')"
  echo "gpu-check: $("$acc" --version 2>&1 | head -1); logs in $dir"
} | tee "$dir/header.txt"

now() { echo $(( $(date +%s%N) / 1000000 )); }  # milliseconds
secs() { local ms=$(( $(now) - $1 )); printf '%d.%d' $((ms / 1000)) $(((ms % 1000) / 100)); }
start_all="$(now)"
rows=()
failed=0
first_error() {  # the first line that says what went wrong
  local line
  line="$(grep -m1 -E '^  FAIL' "$1" | sed -E 's/^  FAIL  //; s/  +/ /g')"
  [ -z "$line" ] && line="$(grep -m1 -E '(^Error|Error:|error:|^acc[^:]*: error)' "$1")"
  [ -z "$line" ] && line="$(grep -v '^\s*$' "$1" | tail -1)"
  echo "${line:0:160}" | tr '|' '/'
}
for backend in "${backends[@]}"; do
  for precision in "${precisions[@]}"; do
    label="$([ "$precision" = no ] && echo fp32 || echo "$precision")"
    log="$dir/check-$backend-$label.log"
    if [ $(( $(now) - start_all )) -gt $(( budget * 1000 )) ]; then
      rows+=("| $backend | $label | not run | - | - | the ${budget}s budget was spent |")
      failed=1
      continue
    fi
    flags=(--backend "$backend")
    [ "$backend" != cpu ] && flags+=(--nproc 1)
    t0="$(now)"
    timeout -k 10 "$per_check" "$acc" check "${flags[@]}" --mixed-precision "$precision" >"$log" 2>&1
    rc=$?
    secs="$(secs "$t0")"
    ratio="$(sed -nE 's/^  step time ratio [a-z0-9]+\/fp32  ([0-9.]+).*/\1/p' "$log" | head -1)"
    device="$(sed -nE 's/^  (PASS|FAIL)  each process on its own expected device +([^ ]+).*/\2/p' "$log" | head -1)"
    if [ "$rc" = 0 ]; then
      result="PASS"; why="${device:+on $device}"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      result="FAIL"; why="timed out after ${per_check}s: $(first_error "$log")"; failed=1
    else
      result="FAIL"; why="$(first_error "$log")"; failed=1
    fi
    rows+=("| $backend | $label | $result | $secs | ${ratio:--} | $why |")
    echo "gpu-check: $backend $label: $result (${secs}s)"
  done
done

# -- the suite's CUDA tests (marked @pytest.mark.cuda, gated in tests/conftest.py)
mapfile -t cuda_tests < <(cd "$root" && grep -rlE 'pytest\.mark\.cuda\b' tests --include='*.py')
if [ "${#cuda_tests[@]}" -gt 0 ] && "$python" -c 'import pytest' 2>/dev/null; then
  log="$dir/pytest-cuda.log"
  t0="$(now)"
  (cd "$root" && timeout -k 10 180 "$python" -m pytest -q -p no:cacheprovider -m cuda -rs "${cuda_tests[@]}") >"$log" 2>&1
  rc=$?
  secs="$(secs "$t0")"
  summary="$(grep -E '(passed|failed|error|skipped)' "$log" | tail -1 | tr '|' '/')"
  if [ "$rc" = 0 ] && ! grep -q skipped <<< "$summary"; then
    rows+=("| pytest -m cuda | - | PASS | $secs | - | $summary |")
  else
    rows+=("| pytest -m cuda | - | FAIL | $secs | - | ${summary:-$(first_error "$log")} |"); failed=1
  fi
  echo "gpu-check: pytest -m cuda: $summary"
fi

# -- the sharded memory rows: peak CUDA memory per rank, 2 processes (one per GPU)
sharded=()
if [ "$gpus" -ge 2 ]; then
  declare -A peak
  for contender in "ddp:--backend ddp" "fsdp:--backend fsdp --fsdp-wrap min_params=1000000" \
                   "deepspeed ZeRO-3:--backend deepspeed --zero-stage 3"; do
    name="${contender%%:*}"
    read -r -a cflags <<< "${contender#*:}"
    log="$dir/sharded-${name// /-}.log"
    t0="$(now)"
    (cd "$root" && MALLOC_MMAP_THRESHOLD_=65536 timeout -k 10 180 "$acc" launch --output-dir '' --nproc 2 "${cflags[@]}" \
      bench/workloads/sharded_step.py) >"$log" 2>&1
    rc=$?
    secs="$(secs "$t0")"
    line="$(grep -m1 '^BENCH ' "$log" | cut -c7-)"
    if [ "$rc" = 0 ] && [ -n "$line" ]; then
      peak[$name]="$("$python" -c 'import json, sys; print(round(json.loads(sys.argv[1]).get("peak_cuda_mb", float("nan")), 1))' "$line")"
      step="$("$python" -c 'import json, sys; print(round(json.loads(sys.argv[1])["per_step_s"], 4))' "$line")"
      ratio="-"
      [ "$name" != ddp ] && [ -n "${peak[ddp]:-}" ] && ratio="$("$python" -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}")' "${peak[$name]}" "${peak[ddp]}")"
      sharded+=("| sharded_step.py, 2 GPUs | $name | PASS | $secs | $ratio | peak CUDA memory per rank ${peak[$name]} MB (ratio: / ddp's), step ${step} s |")
    else
      sharded+=("| sharded_step.py, 2 GPUs | $name | FAIL | $secs | - | $(first_error "$log") |"); failed=1
    fi
  done
else
  sharded+=("| sharded_step.py | - | not run | - | - | $gpus GPU here: the sharded memory rows need 2 (one rank per GPU) |")
fi

# -- context parallel (cp 2 on fsdp, tests/workers/context_parallel.py) against the same script on one process
if [ "$gpus" -ge 2 ]; then
  worker="$root/tests/workers/context_parallel.py"
  log="$dir/context-parallel.log"
  t0="$(now)"
  (cd "$root" && timeout -k 10 120 "$python" "$worker" --out "$dir/cp-one" &&
    timeout -k 10 180 "$acc" launch --output-dir '' --backend fsdp --nproc 2 --parallelism-config-cp-size 2 \
      "$worker" --out "$dir/cp-two") >"$log" 2>&1
  rc=$?
  secs="$(secs "$t0")"
  if [ "$rc" = 0 ]; then
    detail="$("$python" - "$dir/cp-one" "$dir/cp-two" <<'PY' 2>>"$log"
import json, sys, torch
one, two = sys.argv[1], sys.argv[2]
a, b = torch.load(f"{one}/weights.pt"), torch.load(f"{two}/weights.pt")
la, lb = json.load(open(f"{one}/result.json"))["losses"], json.load(open(f"{two}/result.json"))["losses"]
dw = max(float((a[k] - b[k]).abs().max()) for k in a)
dl = max(abs(x - y) for x, y in zip(la, lb))
print(f"{'PASS' if dw <= 1e-4 and dl <= 1e-4 else 'FAIL'} max |dw| {dw:.1e}, max |d loss| {dl:.1e} after 2 SGD steps")
PY
)"
    result="${detail%% *}"; detail="${detail#* }"
    [ "$result" = PASS ] || { result=FAIL; failed=1; }
  else
    result=FAIL; detail="$(first_error "$log")"; failed=1
  fi
  sharded+=("| context parallel, 2 GPUs | cp 2 (fsdp) | $result | $secs | - | ${detail:-$(first_error "$log")} |")
else
  sharded+=("| context parallel | - | not run | - | - | $gpus GPU here: cp 2 needs 2 (one rank per GPU) |")
fi

total="$(secs "$start_all")"
{
  echo
  echo "| backend | precision | result | seconds | mixed/fp32 step | detail (first error line when it failed) |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}" "${sharded[@]}"
  echo
  echo "gpu-check: ${total}s in all; $( [ "$failed" = 0 ] && echo 'every check passed' || echo 'some checks FAILED')"
} | tee "$dir/table.md"
exit "$failed"
