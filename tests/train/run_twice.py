"""Run by test_run_twice.py in a fresh interpreter: train.run() twice, a SIGINT during the first; print what changed."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401  (imported lazily by a training step; its import sets TORCHINDUCTOR_CACHE_DIR)

import imgpipe.train.loop  # noqa: F401  (import-time warning filters of torch and torchvision are not the run's)
from imgpipe.train import load_config, run


def process_state() -> dict:
    return {
        "sigint": repr(signal.getsignal(signal.SIGINT)),
        "sigterm": repr(signal.getsignal(signal.SIGTERM)),
        "filters": repr(warnings.filters),
        "environ": dict(os.environ),
        "torch": [torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic],
    }


def interrupt_after_the_first_step(metrics: Path) -> None:
    deadline = time.monotonic() + 240
    while not (metrics.exists() and '"kind": "step"' in metrics.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C in a terminal: the handler runs in the main thread


def config(packed: str, out: Path, epochs: int) -> object:
    items = [
        f"data.path={packed}",
        "data.backend=synthetic",
        "data.image_size=32",
        "model.name=resnet18",
        f"train.epochs={epochs}",
        "train.batch_size=16",
        "train.validate=false",
        "train.log_every=1",
        "train.deterministic=true",
        "train.amp=fp16",
        f"output.dir={out}",
        "output.tensorboard=false",
        "output.checkpoint_every_epochs=0",
    ]
    return load_config(None, items)


def main() -> None:
    packed, out = sys.argv[1], Path(sys.argv[2])
    before = process_state()
    threading.Thread(target=interrupt_after_the_first_step, args=(out / "first" / "metrics.jsonl",), daemon=True).start()
    first = run(config(packed, out / "first", epochs=50), gpus=0)
    between = process_state()
    second = run(config(packed, out / "second", epochs=1), gpus=0)
    after = process_state()
    print(
        json.dumps(
            {
                "first": [first.stopped_by, first.step],
                "second": [second.stopped_by, second.step, second.epochs_completed],
                "between_same": {k: between[k] == before[k] for k in before},
                "after_same": {k: after[k] == before[k] for k in before},
                "after": {k: v for k, v in after.items() if k != "environ"},
                "before": {k: v for k, v in before.items() if k != "environ"},
                "environ_diff": sorted(set(after["environ"].items()) ^ set(before["environ"].items())),
            }
        )
    )


if __name__ == "__main__":
    main()
