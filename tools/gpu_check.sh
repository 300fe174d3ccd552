#!/usr/bin/env bash
# GPU check for `imgpipe train` on one GPU (sized for one H200, well under 8 minutes).
#
# Packs a synthetic ImageNet-like set, then trains resnet50 (bf16, channels_last, batch 256,
# 224 px) three ways and prints images/s, the ratio to the ceiling and the data-wait per rank:
#   torch      imgpipe's torch loader: CPU worker processes decode, the GPU normalizes;
#   gpudecode  JPEG decoding on the GPU (torchvision.io.decode_jpeg(device="cuda")): skipped
#              with a message while the torch loader has no such option;
#   dali       only where `import nvidia.dali` works, else "skipped DALI";
#   synthetic  one in-memory batch on the GPU: no data loading at all, the ceiling.
# Run from the repository root:  bash tools/gpu_check.sh   (PYTHON=... to pick the interpreter)
# Results: stdout, and $OUT/gpu_check.txt when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
WORK=${GPU_CHECK_WORK:-/tmp/imgpipe-gpu-check}
REPORT=${OUT:-$WORK}/gpu_check.txt
PER_CLASS=${GPU_CHECK_PER_CLASS:-600}
EPOCHS=${GPU_CHECK_EPOCHS:-3}
RUN_TIMEOUT=${GPU_CHECK_RUN_TIMEOUT:-150}
MODEL=${GPU_CHECK_MODEL:-resnet50}
BATCH=${GPU_CHECK_BATCH:-256}
SIZE=${GPU_CHECK_IMAGE_SIZE:-224}
GPUS=${GPU_CHECK_GPUS:-1}  # GPU_CHECK_GPUS=0 (with a small model/size) dry-runs this script on a CPU
CPUS=$(nproc)
WORKERS=$(( CPUS > 2 ? CPUS - 2 : 1 ))
mkdir -p "$WORK" "$(dirname "$REPORT")"
export PYTHONUNBUFFERED=1

missing=$("$PY" - <<'EOF'
import importlib.util
needed = {"click": "click", "tqdm": "tqdm", "yaml": "PyYAML", "numpy": "numpy", "PIL": "Pillow", "torch": "torch", "torchvision": "torchvision"}
print(" ".join(pkg for module, pkg in needed.items() if importlib.util.find_spec(module) is None))
EOF
)
if [ -n "$missing" ]; then
    echo "gpu_check: missing Python packages: $missing (carry them as wheels; see the device README)"
    exit 2
fi
if ! "$PY" -c "import imgpipe.train" 2>/dev/null; then
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: imgpipe is not installed here; using PYTHONPATH=$PWD"
fi
"$PY" -c "import torch, torchvision; assert $GPUS == 0 or torch.cuda.is_available(), 'no CUDA device'; print(f'gpu_check: torch {torch.__version__}, torchvision {torchvision.__version__}, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"CPU only\"}, {torch.cuda.device_count()} GPU(s), $CPUS CPUs')" || exit 3

echo "gpu_check: making and packing the synthetic set ($PER_CLASS images x 10 classes, $WORKERS workers)"
"$PY" - "$WORK" "$PER_CLASS" "$WORKERS" <<'EOF' || exit 4
import sys, time
from pathlib import Path
from imgpipe.packing.packer import pack
from imgpipe.synth import make_synthetic
work, per_class, workers = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
start = time.perf_counter()
if not (work / "packed" / "manifest.json").exists():
    make_synthetic(work / "src", classes=10, per_class=per_class, val_per_class=10, workers=workers, progress=False)
    pack(work / "src", work / "packed", shards=16, workers=workers, progress=False)
print(f"gpu_check: data ready in {time.perf_counter() - start:.0f}s")
EOF

echo "gpu_check: the torch loader's CUDA path (ring slot -> pinned copy -> side stream, GPU normalize) against its CPU path"
"$PY" - "$WORK" <<'EOF' || echo "gpu_check: CUDA loader check FAILED"
import itertools, sys
from pathlib import Path
import torch
import imgpipe
if not torch.cuda.is_available():
    print("gpu_check: skipped the CUDA loader check (no CUDA)")
    sys.exit(0)
packed = Path(sys.argv[1]) / "packed"
common = dict(batch_size=16, train=True, image_size=224, workers=4, seed=0)  # 30 batches: each of the 9 ring slots reused
for normalize, pin in ((True, True), (False, True), (True, False)):
    cpu = list(itertools.islice(imgpipe.make_torch_loader(packed, "train", normalize=normalize, **common), 30))
    gpu = list(itertools.islice(imgpipe.make_torch_loader(packed, "train", device="cuda", channels_last=True, normalize=normalize, pin_memory=pin, **common), 30))
    diff = 0.0
    for (xc, yc), (xg, yg) in zip(cpu, gpu, strict=True):  # every GPU batch kept until now: none overwritten
        assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last), "not channels_last on CUDA"
        assert torch.equal(yg.cpu(), yc), "labels differ"
        diff = max(diff, (xg.cpu().float() - xc.float()).abs().max().item())
    assert diff < 1e-4, f"CUDA and CPU batches differ (max {diff}) with normalize={normalize} pin_memory={pin}"
    print(f"gpu_check: 30 CUDA loader batches equal the CPU ones (max abs diff {diff:.1e}), normalize={normalize} pin_memory={pin}")
EOF

cat > "$WORK/config.yaml" <<EOF
data: {path: $WORK/packed, workers: $WORKERS, image_size: $SIZE}
model: {name: $MODEL}
optim: {warmup_epochs: 0}
train: {epochs: $EPOCHS, batch_size: $BATCH, amp: bf16, channels_last: true, validate: false, log_every: 5, timeout_s: 300}
output: {tensorboard: false, checkpoint_every_epochs: 0}
EOF

run() {  # run NAME BACKEND
    local name=$1 backend=$2
    echo "gpu_check: training $MODEL with data.backend=$backend ($name)"
    rm -rf "$WORK/run-$name"
    timeout "$RUN_TIMEOUT" "$PY" -m imgpipe train --config "$WORK/config.yaml" --gpus "$GPUS" \
        --set "data.backend=$backend" --set "output.dir=$WORK/run-$name" 2> "$WORK/run-$name.err" | tail -n 6
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then echo "gpu_check: $name failed (exit $rc):"; tail -n 5 "$WORK/run-$name.err"; fi
}

run synthetic synthetic
run torch torch
echo "gpu_check: skipped GPU JPEG decode: imgpipe's torch loader has no torchvision.io.decode_jpeg(device='cuda') option yet"
if "$PY" -c "import nvidia.dali" 2>/dev/null; then run dali dali; else echo "gpu_check: skipped DALI (nvidia.dali is not importable here)"; fi

"$PY" - "$WORK" "$MODEL" "$BATCH" "$SIZE" "$GPUS" <<'EOF' | tee "$REPORT"
import json, sys
from pathlib import Path
work, model, batch, size, gpus = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
def last_epoch(name):
    path = work / f"run-{name}" / "metrics.jsonl"
    if not path.exists():
        return None
    epochs = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "epoch"]
    return epochs[-1] if epochs else None
ceiling = last_epoch("synthetic")
print(f"gpu_check results (last epoch of each run; {model}, bf16, channels_last, batch {batch} per rank, {size} px, {max(gpus, 1)} rank(s))")
print(f"{'loader':<10} {'images/s':>9} {'vs ceiling':>10}  data-wait % per rank")
for name in ("synthetic", "torch", "dali"):
    record = last_epoch(name)
    if record is None:
        print(f"{name:<10} {'-':>9} {'-':>10}  (not run or failed)")
        continue
    ratio = record["images_per_s"] / ceiling["images_per_s"] if ceiling else float("nan")
    waits = ", ".join(f"rank {r['rank']}: {100 * r['data_wait_frac']:.1f}" for r in record["ranks"])
    print(f"{name:<10} {record['images_per_s']:>9.1f} {ratio:>10.2f}  {waits}")
EOF
