#!/usr/bin/env bash
# FFCV 1.0.2 in a venv of its own, for `benchmarks/loaders.py --ffcv-python VENV/bin/python`.
# FFCV is never an imgpipe dependency and `make test` does not need it. Idempotent: a venv that
# already imports FFCV's loader is left as it is.
#
#   bash benchmarks/ffcv_env.sh /work/ffcv-venv          # PYTHON=python3.11 by default
set -euo pipefail

VENV=${1:?usage: benchmarks/ffcv_env.sh VENV_PATH}
PYTHON=${PYTHON:-python3.11}
CHECK="import ffcv.loader, ffcv.fields.rgb_image, ffcv.transforms"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    echo "$VENV already has ffcv"
    exit 0
fi

# FFCV's C extension links OpenCV and libjpeg-turbo, found through pkg-config.
PACKAGES=(libopencv-dev libturbojpeg0-dev pkg-config)
if ! dpkg -s "${PACKAGES[@]}" >/dev/null 2>&1; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${PACKAGES[@]}"
fi

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet)
"${PIP[@]}" --upgrade "pip>=24" setuptools wheel
# numba needs numpy < 2.3; torch 2.14.1 / torchvision 0.29.1 are the pair that import together here (as in the Makefile).
"${PIP[@]}" torch==2.14.1 torchvision==0.29.1 "numpy<2.3" numba opencv-python Pillow \
    terminaltables pytorch_pfn_extras fastargs assertpy tqdm psutil
# Built from source against the packages above (hence no build isolation).
"${PIP[@]}" --no-build-isolation ffcv==1.0.2
"$VENV/bin/python" -c "$CHECK"
echo "ffcv ready: $VENV/bin/python"
