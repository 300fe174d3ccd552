#!/usr/bin/env bash
# Mosaic Streaming 0.13.0 and LitData 0.2.76 in a venv of their own, for the remote-storage
# benchmark's peer rows (`benchmarks/_peer_child.py`, `benchmarks/_peer_shards.py`). Neither is ever an
# imgpipe dependency and `make test` does not need them. Idempotent: a venv that already imports
# both is left as it is.
#
#   bash benchmarks/peers_env.sh /work/peers-venv          # PYTHON=python3.11 by default
set -euo pipefail

VENV=${1:?usage: benchmarks/peers_env.sh VENV_PATH}
PYTHON=${PYTHON:-python3.11}
CHECK="import streaming, litdata, obstore, boto3, torchvision.io; from litdata.streaming.writer import BinaryWriter"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    echo "$VENV already has mosaicml-streaming and litdata"
    exit 0
fi

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet)
"${PIP[@]}" --upgrade "pip>=24" setuptools wheel
# torch 2.14.1 / torchvision 0.29.1 are the pair that import together here (as in the Makefile);
# mosaicml-streaming 0.13.0 wants numpy < 2.2. LitData reaches S3 through obstore (0.12.1, as the
# shared venv) and falls back to boto3; Mosaic Streaming downloads whole shards with boto3.
"${PIP[@]}" torch==2.14.1 torchvision==0.29.1 "numpy<2.2" Pillow \
    mosaicml-streaming==0.13.0 litdata==0.2.76 obstore==0.12.1 boto3
"$VENV/bin/python" -c "$CHECK"
echo "peers ready: $VENV/bin/python ($("$VENV/bin/python" -c 'import streaming, litdata; print("streaming", streaming.__version__, "litdata", litdata.__version__)'))"
