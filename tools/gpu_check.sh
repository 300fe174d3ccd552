#!/usr/bin/env bash
# GPU check of imgpipe's GPU paths, sized for one H200 with torch + torchvision only. The whole script keeps to
# GPU_CHECK_BUDGET seconds (600 on a GPU: a device is lent 15 minutes, its start and the transfers included):
# each step's timeout ends at the budget's end at the latest, and a step the budget has no time left for is not
# started and counts as failed. Not yet measured on a GPU: the ramp's torch.compile of ResNet-50 (bounded by
# GPU_CHECK_RAMP_TIMEOUT, 360 s).
#
# Every step runs under `timeout -k` (a rank stuck in a CUDA call ignores SIGTERM: the stop
# handlers turn it into a flag), and the script exits non-zero when any step fails.
#   build      the C extensions for this Python (setup.py build_ext --inplace), then names the JPEG decoder
#   data       a synthetic ImageNet-like set, packed; its val split ends with a partial batch
#   loader     the torch loader's CUDA path (pinned copy on a side stream, GPU normalize) equals its CPU path
#   ceiling    training on data.backend=synthetic (one batch in GPU memory) at each size: the compute ceiling
#   torch      training on imgpipe's torch loader at each size (FFCV's ResNet-50 trains at 160 and 192 px),
#              amp/channels_last left at auto (bf16, channels_last on an H200), with validation
#   ramp       a progressive-resizing run through those sizes, validated at 256 px with flip TTA, torch.compile
#              (on the GPU), BlurPool and EMA: the time-to-accuracy path of the recipes
#   fp16       train.amp=fp16 (GradScaler); on the GPU only (fp16 autocast on the CPU means nothing, and crawls)
#   resume     a run stopped by max_steps mid-epoch, then --resume of its GPU checkpoint
#   spawn      one GPU rank started by the local-ranks launcher, torch's elastic agent (the path of --gpus N > 1)
#   bench      imgpipe bench on the GPU, with the same model
#   dali       only where `import nvidia.dali` works
# The report: decoder, images/s of the loader against the ceiling at each size (loaders fall behind
# at low resolution, where the GPU asks for the most images/s), data-wait per rank, val samples, the bench verdict.
# Run from the repository root:  bash tools/gpu_check.sh   (PYTHON=... to pick the interpreter)
# GPU_CHECK_GPUS=0 with a tiny model and data dry-runs it on the CPU (tests/test_gpu_check.py does), e.g.
#   GPU_CHECK_GPUS=0 GPU_CHECK_MODEL=resnet18 GPU_CHECK_BATCH=8 GPU_CHECK_IMAGE_SIZE=32 GPU_CHECK_PER_CLASS=2 \
#   GPU_CHECK_VAL_PER_CLASS=3 GPU_CHECK_WORKERS=1 GPU_CHECK_RESUME_AT=1 bash tools/gpu_check.sh
# GPU_CHECK_IMAGE_SIZE=N trains at N px alone (GPU_CHECK_SIZES: several sizes, the ramp runs through them); the
# validation size and the synthetic images' sides follow the largest training size unless set.
# Results: stdout, and $OUT/gpu_check.txt when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
WORK=${GPU_CHECK_WORK:-/tmp/imgpipe-gpu-check}
REPORT=${OUT:-$WORK}/gpu_check.txt
GPUS=${GPU_CHECK_GPUS:-1}
MODEL=${GPU_CHECK_MODEL:-resnet50}
BATCH=${GPU_CHECK_BATCH:-256}
SIZES=${GPU_CHECK_SIZES:-${GPU_CHECK_IMAGE_SIZE:-160 192}}  # the training sizes of FFCV's ResNet-50 recipes (rn50-16ep)
read -r -a SIZE_LIST <<< "$SIZES"
SIZE=${SIZE_LIST[0]}
MAX_SIZE=$(printf '%s\n' "${SIZE_LIST[@]}" | sort -n | tail -n 1)
VAL_SIZE=${GPU_CHECK_VAL_SIZE:-$(( (MAX_SIZE * 4 / 3 + 7) / 8 * 8 ))}  # 4/3 of the largest training size: 256 for 192
PER_CLASS=${GPU_CHECK_PER_CLASS:-400}         # 10 classes: 4000 train images, 15 steps of 256 per epoch
VAL_PER_CLASS=${GPU_CHECK_VAL_PER_CLASS:-27}  # 270 val images: a full batch of 256, then 14
MIN_SIDE=${GPU_CHECK_MIN_SIDE:-$(( VAL_SIZE * 5 / 4 < 300 ? VAL_SIZE * 5 / 4 : 300 ))}  # 300-500 px at 256 px validation
MAX_SIDE=${GPU_CHECK_MAX_SIDE:-$(( VAL_SIZE * 2 < 500 ? VAL_SIZE * 2 : 500 ))}
EPOCHS=${GPU_CHECK_EPOCHS:-2}
BENCH_STEPS=${GPU_CHECK_BENCH_STEPS:-20}
RESUME_AT=${GPU_CHECK_RESUME_AT:-5}  # a step inside the first epoch
DALI=${GPU_CHECK_DALI:-auto}         # auto: where nvidia.dali imports; 0: never
RUN_TIMEOUT=${GPU_CHECK_RUN_TIMEOUT:-150}
COMPILE=${GPU_CHECK_COMPILE:-$([ "$GPUS" -gt 0 ] && echo true || echo false)}  # the ramp run only: compiling a ResNet on the CPU takes minutes
RAMP_TIMEOUT=${GPU_CHECK_RAMP_TIMEOUT:-360}  # the compile of ResNet-50's training step included
BUILD=${GPU_CHECK_BUILD:-$([ "$GPUS" -gt 0 ] && echo 1 || echo 0)}
BUDGET=${GPU_CHECK_BUDGET:-$([ "$GPUS" -gt 0 ] && echo 600 || echo 270)}  # seconds for the whole script
CPUS=$(nproc)
WORKERS=${GPU_CHECK_WORKERS:-$(( CPUS > 2 ? CPUS - 2 : 1 ))}
KILL_AFTER=10
mkdir -p "$WORK" "$(dirname "$REPORT")"
# the torch loader's rings: (workers x 2 + 2) uint8 batches of the largest size in /dev/shm per loader; fewer workers where they would not fit
SHM_FREE=$(df --output=avail -B1 /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ')
if [ -n "$SHM_FREE" ]; then
    BIGGEST=$(( MAX_SIZE > VAL_SIZE ? MAX_SIZE : VAL_SIZE ))
    SLOT=$(( BATCH * 3 * BIGGEST * BIGGEST ))
    FIT=$(( (SHM_FREE * 3 / 4 / SLOT - 1) / 2 ))
    if [ "$FIT" -lt "$WORKERS" ]; then
        echo "gpu_check: /dev/shm has $(( SHM_FREE >> 20 )) MiB free: $FIT loader worker(s) instead of $WORKERS"
        WORKERS=$(( FIT > 1 ? FIT : 1 ))
    fi
fi
export PYTHONUNBUFFERED=1
FAILED=()
TIMES=()

step() {  # step NAME SECONDS COMMAND...: run under timeout -k, ending by the budget's end; a non-zero exit is a failure of NAME
    local name=$1 limit=$2 rc start=$SECONDS left=$(( BUDGET - SECONDS ))
    shift 2
    [ "${UNBUDGETED:-0}" = 1 ] && left=$limit  # the report: always written
    if [ "$left" -le 0 ]; then
        FAILED+=("$name (not run: the ${BUDGET}s of GPU_CHECK_BUDGET are spent)")
        echo "gpu_check: FAILED $name: not run, the ${BUDGET}s of GPU_CHECK_BUDGET are spent"
        return 124
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    timeout -k "$KILL_AFTER" "$limit" "$@"
    rc=$?
    TIMES+=("$name $(( SECONDS - start ))s")
    if [ "$rc" -ne 0 ]; then
        FAILED+=("$name (exit $rc$([ "$rc" -eq 124 ] && echo ", timed out after ${limit}s"))")
        echo "gpu_check: FAILED $name (exit $rc)"
    fi
    return "$rc"
}
SKIPPED=()
skip() {  # skip NAME REASON: a step that is not run here, said in one line (and in the report)
    SKIPPED+=("$1: $2")
    echo "gpu_check: skipped $1: $2"
}

missing=$(timeout -k "$KILL_AFTER" 60 "$PY" - <<'EOF'
import importlib.util
needed = {"click": "click", "tqdm": "tqdm", "yaml": "PyYAML", "numpy": "numpy", "PIL": "Pillow", "psutil": "psutil", "pydantic": "pydantic", "torch": "torch", "torchvision": "torchvision"}
print(" ".join(pkg for module, pkg in needed.items() if importlib.util.find_spec(module) is None))
EOF
)
if [ -n "$missing" ]; then
    echo "gpu_check: missing Python packages: $missing (carry them as wheels; see the device README)"
    exit 2
fi
if ! timeout -k "$KILL_AFTER" 60 "$PY" -c "import imgpipe.train" 2>/dev/null; then
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: imgpipe is not installed here; using PYTHONPATH=$PWD"
fi
timeout -k "$KILL_AFTER" 120 "$PY" -c "import sys, torch, torchvision; assert $GPUS == 0 or torch.cuda.is_available(), 'no CUDA device'; print(f'gpu_check: Python {sys.version.split()[0]}, torch {torch.__version__}, torchvision {torchvision.__version__}, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"CPU only\"}, {torch.cuda.device_count()} GPU(s), $CPUS CPUs')" || exit 3

if [ "$BUILD" = 1 ]; then
    echo "gpu_check: building the C extensions for this Python (setup.py build_ext --inplace)"
    timeout -k "$KILL_AFTER" $(( BUDGET - SECONDS < 240 ? BUDGET - SECONDS : 240 )) "$PY" setup.py build_ext --inplace > "$WORK/build.log" 2>&1 \
        || { echo "gpu_check: the build failed (the loader falls back to torchvision); last lines:"; tail -n 5 "$WORK/build.log"; }
fi
step decoder 60 "$PY" - > "$WORK/decoder.txt" <<'EOF'
import importlib.util
from imgpipe.loaders.pixels import describe_jpeg_decoder
shrink = "built" if importlib.util.find_spec("imgpipe.image._jpeg_shrink") else "not built (pack --resize uses Pillow)"
print(f"JPEG decoding: {describe_jpeg_decoder()}; pack's shrinker: {shrink}")
EOF
cat "$WORK/decoder.txt"

echo "gpu_check: making and packing the synthetic set ($PER_CLASS + $VAL_PER_CLASS images x 10 classes, $WORKERS workers)"
step data 300 "$PY" - "$WORK" "$PER_CLASS" "$VAL_PER_CLASS" "$MIN_SIDE" "$MAX_SIDE" "$WORKERS" <<'EOF' || exit 4
import sys, time
from pathlib import Path
from imgpipe import pack  # the public API: stays where the modules move
from imgpipe.synth.tree import make_synthetic
work = Path(sys.argv[1])
per_class, val_per_class, min_side, max_side, workers = map(int, sys.argv[2:])
start = time.perf_counter()
if not (work / "packed" / "manifest.json").exists():
    make_synthetic(work / "src", classes=10, per_class=per_class, val_per_class=val_per_class, min_side=min_side, max_side=max_side, workers=workers, progress=False)
    pack(work / "src", work / "packed", shards=16, workers=workers, progress=False)
print(f"gpu_check: data ready in {time.perf_counter() - start:.0f}s")
EOF

if [ "$GPUS" -gt 0 ]; then
    echo "gpu_check: the torch loader's CUDA path (ring slot -> pinned copy -> side stream, GPU normalize) against its CPU path"
    step loader 180 "$PY" - "$WORK" "$SIZE" <<'EOF'
import itertools, sys
from pathlib import Path
import torch
import imgpipe
packed, size = Path(sys.argv[1]) / "packed", int(sys.argv[2])
common = dict(batch_size=16, train=True, image_size=size, workers=4, seed=0)  # 30 batches: each of the 9 ring slots reused
for normalize, pin in ((True, True), (False, True), (True, False)):
    cpu = list(itertools.islice(imgpipe.make_torch_loader(packed, "train", device="cpu", normalize=normalize, **common), 30))
    gpu = list(itertools.islice(imgpipe.make_torch_loader(packed, "train", device="cuda", channels_last=True, normalize=normalize, pin_memory=pin, **common), 30))
    diff = 0.0
    for (xc, yc), (xg, yg) in zip(cpu, gpu, strict=True):  # every GPU batch kept until now: none overwritten
        assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last), "not channels_last on CUDA"
        assert torch.equal(yg.cpu(), yc), "labels differ"
        diff = max(diff, (xg.cpu().float() - xc.float()).abs().max().item())
    assert diff < 1e-4, f"CUDA and CPU batches differ (max {diff}) with normalize={normalize} pin_memory={pin}"
    print(f"gpu_check: 30 CUDA loader batches equal the CPU ones (max abs diff {diff:.1e}), normalize={normalize} pin_memory={pin}")
EOF
else
    echo "gpu_check: skipped the CUDA loader check (GPU_CHECK_GPUS=0)"
fi

cat > "$WORK/config.yaml" <<EOF
data: {path: $WORK/packed, workers: $WORKERS, image_size: $SIZE}
model: {name: $MODEL}
optim: {warmup_epochs: 0}
train: {epochs: $EPOCHS, batch_size: $BATCH, validate: false, log_every: 5, timeout_s: 120, compile: false}
output: {tensorboard: false, checkpoint_every_epochs: 0}
EOF

train() {  # train NAME [imgpipe train options...]: a run into $WORK/run-NAME; its last lines, or why it failed
    local name=$1 rc
    shift
    echo "gpu_check: $name: imgpipe train $*"
    [ "${RESUMING:-0}" = 1 ] || rm -rf "$WORK/run-$name"
    step "$name" "${LIMIT:-$RUN_TIMEOUT}" "$PY" -m imgpipe train --config "$WORK/config.yaml" --gpus "$GPUS" \
        --set "output.dir=$WORK/run-$name" "$@" > "$WORK/run-$name.out" 2> "$WORK/run-$name.err"
    rc=$?
    tail -n 3 "$WORK/run-$name.out"
    [ "$rc" -eq 0 ] || tail -n 5 "$WORK/run-$name.err"
    return "$rc"
}

for size in "${SIZE_LIST[@]}"; do
    train "ceiling-$size" --set data.backend=synthetic --set "data.image_size=$size"
    train "torch-$size" --set train.validate=true --set "data.image_size=$size"
done
RAMP="[$(IFS=,; echo "${SIZE_LIST[*]}")]"
[ "$COMPILE" = true ] || echo "gpu_check: the ramp runs without torch.compile here (GPU_CHECK_COMPILE=true forces it; on the CPU compiling a ResNet takes minutes)"
LIMIT=$RAMP_TIMEOUT train ramp --set "data.resolution=$RAMP" --set "train.epochs=${#SIZE_LIST[@]}" --set train.validate=true \
    --set "data.val_image_size=$VAL_SIZE" --set data.val_flip_tta=true --set model.blurpool=true --set train.ema=true \
    --set "train.compile=$COMPILE"
if [ "$GPUS" -gt 0 ]; then
    train fp16 --set data.backend=synthetic --set train.amp=fp16 --set train.epochs=1
else
    skip fp16 "fp16 autocast and its gradient scaler only mean anything on a GPU (GPU_CHECK_GPUS=0)"
fi
if train resume --set train.epochs=1 --set "train.max_steps=$RESUME_AT"; then
    if RESUMING=1 train resume --set train.epochs=1 --resume && ! grep -q "resumed from .* at epoch 0, step $RESUME_AT" "$WORK/run-resume.err"; then
        FAILED+=("resume (no 'resumed from ... at epoch 0, step $RESUME_AT')")
        echo "gpu_check: FAILED resume: it did not resume at epoch 0, step $RESUME_AT"
    fi
fi

echo "gpu_check: spawn: one rank started by the local-ranks launcher (torch's elastic agent)"
cat > "$WORK/spawn.py" <<'EOF'
import sys
from pathlib import Path
from imgpipe.errors import ImgpipeError
from imgpipe.train import _train_rank, load_config
from imgpipe.train.rundir import make_output_dir
from imgpipe.train.local_ranks import start_local_ranks  # --gpus N starts N > 1 ranks this way; one GPU here, so one rank

if __name__ == "__main__":
    work, gpus = Path(sys.argv[1]), int(sys.argv[2])
    config = load_config(work / "config.yaml", [f"output.dir={work / 'run-spawn'}", "data.backend=synthetic", "train.epochs=1"])
    make_output_dir(config)
    try:
        result = start_local_ranks(_train_rank, config, 1, use_cuda=gpus > 0, backend=None, timeout_s=config.train.timeout_s, grace_s=10)
    except ImgpipeError as e:
        sys.exit(f"imgpipe: error: {e}")
    print(f"done: {result.epochs_completed} epoch(s), {result.step} steps in a spawned rank")
EOF
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" step spawn "$RUN_TIMEOUT" "$PY" "$WORK/spawn.py" "$WORK" "$GPUS" > "$WORK/run-spawn.out" 2> "$WORK/run-spawn.err" || tail -n 5 "$WORK/run-spawn.err"
tail -n 1 "$WORK/run-spawn.out"

echo "gpu_check: bench: imgpipe bench on $([ "$GPUS" -gt 0 ] && echo "the GPU" || echo "the CPU")"
step bench 240 "$PY" -m imgpipe bench "$WORK/packed" --gpus "$GPUS" --workers "$WORKERS" --steps "$BENCH_STEPS" --warmup 3 \
    --batch-size "$BATCH" --image-size "$SIZE" --model "$MODEL" --json "$WORK/bench.json" > "$WORK/bench.out" 2> "$WORK/bench.err" \
    || tail -n 5 "$WORK/bench.err"

if [ "$DALI" != 0 ] && timeout -k "$KILL_AFTER" 60 "$PY" -c "import nvidia.dali" 2>/dev/null; then
    train dali --set data.backend=dali
else
    echo "gpu_check: skipped DALI (GPU_CHECK_DALI=0, or nvidia.dali is not importable here)"
fi

UNBUDGETED=1 step report 60 "$PY" - "$WORK" "$MODEL" "$BATCH" "$SIZES" "$VAL_SIZE" "$GPUS" ${SKIPPED[@]+"${SKIPPED[@]}"} > "$REPORT" <<'EOF'
import json, sys
from pathlib import Path
work, model, batch, sizes, val_size, gpus = Path(sys.argv[1]), sys.argv[2], sys.argv[3], [int(s) for s in sys.argv[4].split()], int(sys.argv[5]), int(sys.argv[6])
skipped = dict(line.split(": ", 1) for line in sys.argv[7:])
problems = []
def epochs(name):
    path = work / f"run-{name}" / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "epoch"] if path.exists() else []
def last_epoch(name):
    return (epochs(name) or [None])[-1]
print(f"gpu_check results ({model}, batch {batch} per rank, {' and '.join(map(str, sizes))} px, {max(gpus, 1)} rank(s) on {'the GPU' if gpus else 'the CPU'}; last epoch of each run)")
print((work / "decoder.txt").read_text().strip() if (work / "decoder.txt").exists() else "JPEG decoding: unknown (the decoder step failed)")
print(f"{'run':<12} {'px':>4} {'amp, memory format':<22} {'images/s':>9} {'vs ceiling':>10}  {'val samples':>11}  data-wait % per rank")
names = [name for size in sizes for name in (f"ceiling-{size}", f"torch-{size}")] + ["ramp", "fp16", "resume", "dali"]
for name in names:
    record = last_epoch(name)
    if name in skipped:
        print(f"{name:<12} skipped: {skipped[name]}")
        continue
    if record is None:
        if name != "dali" or (work / "run-dali").exists():
            print(f"{name:<12} {'-':>4} {'-':<22} {'-':>9} {'-':>10}  {'-':>11}  (failed: no epoch ended)")
        continue
    ceiling = last_epoch(f"ceiling-{record.get('resolution')}") or last_epoch(f"ceiling-{sizes[0]}")
    ratio = record["images_per_s"] / ceiling["images_per_s"] if ceiling and ceiling["images_per_s"] else float("nan")
    waits = ", ".join(f"rank {r['rank']}: {100 * r['data_wait_frac']:.1f}" for r in record["ranks"])
    memory_format = f"{record.get('amp')}, {'channels_last' if record.get('channels_last') else 'NCHW'}"
    print(f"{name:<12} {record.get('resolution', '-'):>4} {memory_format:<22} {record['images_per_s']:>9.1f} {ratio:>10.2f}  {record.get('val_samples', '-'):>11}  {waits}")
for size in sizes:
    loader, ceiling = last_epoch(f"torch-{size}"), last_epoch(f"ceiling-{size}")
    if loader and ceiling and ceiling["images_per_s"]:
        print(f"loader at {size} px: {loader['images_per_s']:.0f} images/s, {loader['images_per_s'] / ceiling['images_per_s']:.2f}x the in-memory ceiling ({ceiling['images_per_s']:.0f})")
ramp = epochs("ramp")
if ramp:
    last = ramp[-1]
    print(
        f"ramp     epochs at {[r['resolution'] for r in ramp]} px, validated at {last.get('val_resolution')} px with flip TTA: "
        f"top-1 {last.get('val_top1', float('nan')):.4f}, EMA top-1 {last.get('ema_val_top1', float('nan')):.4f}, {last['wall_s']:.0f} s"
    )
    if [r["resolution"] for r in ramp] != sizes or last.get("val_resolution") != val_size or "ema_val_top1" not in last:
        problems.append(f"ramp: trained at {[r['resolution'] for r in ramp]} px, validated at {last.get('val_resolution')} px; expected {sizes} and {val_size}, with EMA metrics")
expected = ("bf16", True) if gpus else ("none", False)
for name in [n for n in names if n.startswith(("ceiling-", "torch-"))]:
    record = last_epoch(name)
    if record is not None and (record.get("amp"), record.get("channels_last")) != expected:
        problems.append(f"{name}: amp/channels_last auto ran {record.get('amp')}, {record.get('channels_last')}; expected {expected[0]}, {expected[1]}")
spawned = (work / "run-spawn.out").read_text().splitlines() if (work / "run-spawn.out").exists() else []
print(f"spawn    {next((line for line in spawned if line.startswith('done:')), 'failed')}")
bench = (work / "bench.out").read_text().splitlines() if (work / "bench.out").exists() else []
verdict = next((line for line in bench if line.startswith("verdict:")), None)
print(f"bench    {verdict or 'failed: no verdict'}")
for problem in problems:
    print(f"PROBLEM: {problem}")
sys.exit(1 if problems else 0)
EOF
cat "$REPORT"

echo "gpu_check: seconds per step: ${TIMES[*]}; total ${SECONDS}s" | tee -a "$REPORT"
if [ ${#FAILED[@]} -gt 0 ]; then
    printf 'gpu_check: FAILED: %s\n' "${FAILED[@]}" | tee -a "$REPORT"
    exit 1
fi
echo "gpu_check: every step passed" | tee -a "$REPORT"
