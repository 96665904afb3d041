#!/usr/bin/env bash
# The GPU test run (make test-gpu). Without a CUDA GPU it prints one line and exits 0.
#
# With one: the pytest tests marked gpu (tests/test_gpu.py, lab 10's U-Net plans), then nbval over every lab
# twice: as the labs choose by default (mode "auto": a lab asking for more devices than
# there are GPUs simulates them on the CPU), and with PARLAB_DEVICES=shared-gpu (every
# rank on the GPU, messages through host memory). TensorFlow cells are skipped where
# TensorFlow is not installed. A report with the GPU, driver and torch versions goes
# to gpu-test-report.txt: copy what it says into docs/gpu.md.
#
# On a bare machine (Python and a CUDA torch, no internet, no pytest): put the wheels from
# scripts/gpu-wheels.sh in wheels/ first; they are installed into .venv-gpu, a virtual
# environment that also sees the system's torch (--system-site-packages).
set -uo pipefail
cd "$(dirname "$0")/.."
# The Python to test with: $PYTHON if given, else the course's .venv (make install), else python3
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null)
if [ -z "$gpus" ]; then
    echo "make test-gpu: $PYTHON cannot import torch; install a CUDA build of torch first" >&2
    exit 2
fi
if [ "$gpus" = 0 ]; then
    echo "make test-gpu: no CUDA GPU visible to torch ($PYTHON): nothing run, GPU tests skipped"
    exit 0
fi

TOOLS='import pytest, nbval, ipykernel, cloudpickle, matplotlib, psutil'   # what the run needs
if ! "$PYTHON" -c "$TOOLS" 2>/dev/null; then
    if [ ! -d wheels ]; then
        echo "pytest/nbval are missing and there is no wheels/ folder: run scripts/gpu-wheels.sh" \
             "on a machine with internet and copy wheels/ here" >&2
        exit 2
    fi
    if "$PYTHON" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
        # The Python is itself a virtual environment (the GPU machines' /opt/torch/.venv):
        # a venv made from it would see the base interpreter's packages, not its torch.
        # Install the tools beside it instead, into a folder put on PYTHONPATH. pip's --target
        # ignores what is installed already (it would want numpy's wheel even where numpy is
        # there): hand it the wheels whose distribution this Python lacks, without resolving.
        missing=$("$PYTHON" - <<'PY'
import glob, importlib.metadata as md, os, re
for path in sorted(glob.glob("wheels/*.whl")):
    name = os.path.basename(path).split("-")[0]
    try:
        md.distribution(re.sub(r"[-_.]+", "-", name))
    except md.PackageNotFoundError:
        print(path)
PY
)
        [ -z "$missing" ] || "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile \
            --upgrade --target .gpu-site $missing || exit 2
        export PYTHONPATH="$(pwd)/.gpu-site${PYTHONPATH:+:$PYTHONPATH}"
    else
        [ -x .venv-gpu/bin/python ] || "$PYTHON" -m venv --system-site-packages .venv-gpu || exit 2
        .venv-gpu/bin/python -m pip install --quiet --no-index --find-links wheels \
            -r scripts/gpu-requirements.txt || exit 2
        PYTHON=.venv-gpu/bin/python
    fi
    if ! "$PYTHON" -c "$TOOLS"; then
        echo "make test-gpu: the tools still do not import after installing wheels/ (above):" \
             "run scripts/gpu-wheels.sh again for this Python" >&2
        exit 2
    fi
fi

export PYTHONPATH="$(pwd):$(pwd)/tests${PYTHONPATH:+:$PYTHONPATH}"
export MPLBACKEND=Agg
REPORT=gpu-test-report.txt
{
    echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M')"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
        | sed 's/^/GPU: /'
    "$PYTHON" - <<'PY'
import sys, torch
v = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else "none"
nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"NCCL {nccl}, GPUs visible {torch.cuda.device_count()}")
PY
} | tee "$REPORT"

status=0
run() {  # run NAME COMMAND...: run, note the result in the report
    local name=$1; shift
    echo "== $name" | tee -a "$REPORT"
    "$@" 2>&1 | tee -a "$REPORT.log" | tail -n 25
    local rc=${PIPESTATUS[0]}
    echo "$name: $([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")" | tee -a "$REPORT"
    [ "$rc" = 0 ] || status=1
}
: > "$REPORT.log"
PYTEST=("$PYTHON" -m pytest -p no:cacheprovider -rs)
NBVAL=(-p nbval_tensorflow_cells --nbval-lax --nbval-current-env --nbval-cell-timeout=600)
# The notebooks to run: $LABS (paths, space-separated) or every lab.
read -r -a NOTEBOOKS <<< "${LABS:-$(ls labs/[0-9]*.ipynb | tr '\n' ' ')}"
# GPU_TEST_JOBS=N (N > 1, for a machine with many cores): the GPU tests and both nbval passes
# run at once, each pass N notebooks at a time, each notebook in its own pytest. Each of the
# labs' 4 simulated ranks wants a core: about 4 cores per notebook at once.
JOBS=${GPU_TEST_JOBS:-1}
if ! [[ "$JOBS" =~ ^[1-9][0-9]*$ ]]; then
    echo "make test-gpu: GPU_TEST_JOBS must be a whole number of at least 1, not '$JOBS'" >&2
    exit 2
fi

if [ "$JOBS" = 1 ]; then
    run "gpu tests" "${PYTEST[@]}" -m gpu tests/test_gpu.py tests/test_unet_strategies.py
    run "labs, mode auto" "${PYTEST[@]}" "${NBVAL[@]}" "${NOTEBOOKS[@]}"
    run "labs, PARLAB_DEVICES=shared-gpu" env PARLAB_DEVICES=shared-gpu \
        "${PYTEST[@]}" "${NBVAL[@]}" "${NOTEBOOKS[@]}"
    echo "full output: $REPORT.log" | tee -a "$REPORT"
    exit $status
fi

# Parallel: every part writes its own log under gpu-test-logs/ and one line per notebook
# to the report; a pass fails if any of its notebooks does.
LOGS=gpu-test-logs
rm -rf "$LOGS"; mkdir -p "$LOGS"
one_notebook() {  # one_notebook MODE NOTEBOOK: nbval over one lab, one line of result
    local mode=$1 nb=$2 log start rc
    log="$LOGS/$mode-$(basename "$nb" .ipynb).log"
    start=$SECONDS
    if [ "$mode" = shared-gpu ]; then
        env PARLAB_DEVICES=shared-gpu "${PYTEST[@]}" "${NBVAL[@]}" "$nb" > "$log" 2>&1
    else
        "${PYTEST[@]}" "${NBVAL[@]}" "$nb" > "$log" 2>&1
    fi
    rc=$?
    echo "  $mode $nb: $(tail -n 1 "$log" | tr -d '=' | sed 's/^ *//') ($((SECONDS - start)) s)$([ $rc = 0 ] || echo " FAILED (exit $rc)")"
    return $rc
}
export -f one_notebook
# bash arrays cannot be exported: the commands go to xargs' shells as one string each
export LOGS PYTHON PYTEST_CMD="${PYTEST[*]}" NBVAL_OPTS="${NBVAL[*]}"
pass() {  # pass MODE: every notebook, JOBS at a time
    local mode=$1
    printf '%s\n' "${NOTEBOOKS[@]}" | xargs -P "$JOBS" -I{} bash -c \
        'PYTEST=($PYTEST_CMD); NBVAL=($NBVAL_OPTS); one_notebook "$0" "$1"' "$mode" {}
}
start=$SECONDS
( "${PYTEST[@]}" -m gpu tests/test_gpu.py tests/test_unet_strategies.py > "$LOGS/gpu-tests.log" 2>&1 ) &
tests_pid=$!
( pass auto > "$LOGS/auto.lines" ) &
auto_pid=$!
# The shared-GPU pass runs copies of the notebooks: two passes of lab 10 at once would save
# and reload the same model file, two of lab 09 write the same traces.
mkdir -p "$LOGS/shared-labs"
cp "${NOTEBOOKS[@]}" "$LOGS/shared-labs/"
( NOTEBOOKS=("${NOTEBOOKS[@]/#*\//$LOGS/shared-labs/}"); pass shared-gpu > "$LOGS/shared-gpu.lines" ) &
shared_pid=$!
for part in "gpu tests:$tests_pid:gpu-tests.log" "labs, mode auto:$auto_pid:auto.lines" \
            "labs, PARLAB_DEVICES=shared-gpu:$shared_pid:shared-gpu.lines"; do
    IFS=: read -r name pid file <<< "$part"
    wait "$pid"; rc=$?
    echo "== $name" | tee -a "$REPORT"
    if [ "$file" = gpu-tests.log ]; then tail -n 25 "$LOGS/$file"; else sort "$LOGS/$file" | tee -a "$REPORT"; fi
    echo "$name: $([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")" | tee -a "$REPORT"
    [ "$rc" = 0 ] || status=1
done
cat "$LOGS"/*.log > "$REPORT.log"
echo "all parts at once, $JOBS notebooks at a time per pass: $((SECONDS - start)) s" | tee -a "$REPORT"
echo "full output: $REPORT.log (each part: $LOGS/)" | tee -a "$REPORT"
exit $status
