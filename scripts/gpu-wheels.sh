#!/usr/bin/env bash
# Download, on a machine WITH internet, the wheels the GPU test run needs, for a GPU
# machine WITHOUT internet that has Python 3.12 and a CUDA build of torch (torch itself is
# not downloaded). Copy the repository with its wheels/ folder there and run
# scripts/test-gpu.sh (or make test-gpu).
#
#   scripts/gpu-wheels.sh            # -> wheels/
#   PY_VERSION=3.11 scripts/gpu-wheels.sh   # for another Python
#
# --only-binary=:all: with --platform/--python-version is how pip fetches wheels for a
# machine other than this one (pip documentation, "pip download"); several --platform tags
# cover wheels built for older and newer manylinux baselines.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${PY_VERSION:-3.12}
ABI=cp${PY_VERSION/./}
PIP=${PIP:-python3 -m pip}
mkdir -p wheels
$PIP download --only-binary=:all: --dest wheels \
    --python-version "$PY_VERSION" --implementation cp --abi "$ABI" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 \
    --constraint constraints.txt \
    -r scripts/gpu-requirements.txt
echo "wheels for Python $PY_VERSION in $(pwd)/wheels: $(ls wheels | wc -l) files"
