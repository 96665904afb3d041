#!/usr/bin/env bash
# The GPU test run (make test-gpu). Without a CUDA GPU it prints one line and exits 0.
#
# With one: the pytest tests marked gpu (tests/test_gpu.py, lab 10's U-Net plans), then nbval over every lab
# twice: as the labs choose by default (mode "auto": a lab asking for more devices than
# there are GPUs simulates them on the CPU), and with PARLAB_DEVICES=shared-gpu (every
# rank on the GPU, messages through host memory). TensorFlow cells are skipped where
# TensorFlow is not installed. A report with the GPU, driver and torch versions goes
# to gpu-test-report.txt: copy what it says into the README's GPU section.
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

if ! "$PYTHON" -c 'import pytest, nbval, ipykernel, cloudpickle, matplotlib, psutil' 2>/dev/null; then
    if [ ! -d wheels ]; then
        echo "pytest/nbval are missing and there is no wheels/ folder: run scripts/gpu-wheels.sh" \
             "on a machine with internet and copy wheels/ here" >&2
        exit 2
    fi
    if "$PYTHON" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
        # The Python is itself a virtual environment (the GPU machines' /opt/torch/.venv):
        # a venv made from it would see the base interpreter's packages, not its torch.
        # Install the tools beside it instead, into a folder put on PYTHONPATH.
        "$PYTHON" -m pip install --quiet --no-index --find-links wheels --target .gpu-site \
            -r scripts/gpu-requirements.txt || exit 2
        export PYTHONPATH="$(pwd)/.gpu-site${PYTHONPATH:+:$PYTHONPATH}"
    else
        [ -x .venv-gpu/bin/python ] || "$PYTHON" -m venv --system-site-packages .venv-gpu || exit 2
        .venv-gpu/bin/python -m pip install --quiet --no-index --find-links wheels \
            -r scripts/gpu-requirements.txt || exit 2
        PYTHON=.venv-gpu/bin/python
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
run "gpu tests" "${PYTEST[@]}" -m gpu tests/test_gpu.py tests/test_unet_strategies.py
run "labs, mode auto" "${PYTEST[@]}" "${NBVAL[@]}" labs
run "labs, PARLAB_DEVICES=shared-gpu" env PARLAB_DEVICES=shared-gpu "${PYTEST[@]}" "${NBVAL[@]}" labs
echo "full output: $REPORT.log" | tee -a "$REPORT"
exit $status
