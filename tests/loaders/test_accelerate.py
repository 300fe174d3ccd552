"""Both loaders, used unchanged in Hugging Face Accelerate: DDP on 2 CPU ranks (real Accelerate, real gloo)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from imgpipe.loaders.sampler import rank_indices
from imgpipe.loaders.torch import make_torch_loader
from tests._cli import run_in_group
from tests._packs import INDEXED_RECORDS as RECORDS  # one label each, so labels name the records; odd: eval parts differ by one

pytest.importorskip("accelerate", reason="accelerate is a dev dependency: pip install -e '.[dev]'")

SCRIPT = Path(__file__).with_name("accelerate_ddp.py")
REPO = Path(__file__).resolve().parents[2]
SAVE_AFTER = 2  # accelerate_ddp.py saves the state after this many steps of epoch 1


def global_batches(data: Path, epoch: int) -> list[tuple[list[int], list[float]]]:
    """The global stream on one process (world size 1, G = 2 x 4): each global batch's labels and pixel sums."""
    loader = make_torch_loader(data, "train", batch_size=8, image_size=16, workers=0, rank=0, world_size=1, device="cpu")
    loader.set_epoch(epoch)
    return [(labels.tolist(), images.double().sum(dim=(1, 2, 3)).tolist()) for images, labels in loader]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_accelerate_ddp_trains_two_epochs_on_the_global_stream_and_resumes(indexed: Path, tmp_path: Path, backend: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "HF_HOME": str(tmp_path / "hf"),  # no user's accelerate config: every setting is a flag below
        "CUDA_VISIBLE_DEVICES": "",  # CPU ranks: the loaders' default device is then the CPU, as the model's
        "TMPDIR": str(tmp_path),  # torch's launcher under Accelerate's leaves a torchelastic_* log folder in it
    }
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        "0",
    ]
    run = run_in_group([*launch, str(SCRIPT), str(indexed), str(out), backend], 380, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]

    for r, rank in enumerate(ranks):
        assert rank["prepared_unchanged"]  # prepare hands the loaders back as they are: nothing re-shards or wraps them
        assert (rank["rank"], rank["world_size"]) == (rank["loader_rank"], rank["loader_world_size"]) == (r, 2)
    for epoch in (0, 1):
        stream = global_batches(indexed, epoch)
        assert len(stream) == RECORDS // 8
        for r, rank in enumerate(ranks):
            mine = rank["epochs"][epoch]["train"]
            assert [b["labels"] for b in mine] == [
                labels[4 * r : 4 * r + 4] for labels, _ in stream
            ]  # rank r's batch b = global batch b's r-th slice
            if backend == "torch":  # the same crops and flips as on one process (DALI resizes with another filter)
                for b, (_, sums) in zip(mine, stream):
                    assert b["sums"] == pytest.approx(sums[4 * r : 4 * r + 4], rel=1e-9)
            expected_val = rank_indices(RECORDS, seed=0, epoch=epoch, rank=r, world_size=2, batch_size=4, train=False).tolist()
            assert rank["epochs"][epoch]["val"] == expected_val
        val = [rank["epochs"][epoch]["val"] for rank in ranks]
        assert len(val[0]) != len(val[1]) and sorted(val[0] + val[1]) == list(range(RECORDS))  # every sample once, none padded
        for rank in ranks:
            assert rank["epochs"][epoch]["val_gathered"] == val[0] + val[1]  # gather_for_metrics drops and duplicates nothing
    for rank in ranks:
        assert rank["epochs"][0]["train"] != rank["epochs"][1]["train"]  # set_epoch and per-epoch order: epoch 1 is a new order

    # DDP really synced: other initial weights, rank 0's after prepare, equal after training on other batches
    assert ranks[0]["initial"] != ranks[1]["initial"]
    assert ranks[0]["prepared"] == ranks[1]["prepared"] == ranks[0]["initial"]
    assert ranks[0]["trained"] == ranks[1]["trained"] != ranks[0]["prepared"]
    for rank in ranks:
        # load_state restores the model of the save and the loader's position: the rest of epoch 1, no batch twice
        assert rank["restored"] == rank["saved"] != rank["trained"]
        assert rank["resumed"] == [b["labels"] for b in rank["epochs"][1]["train"]][SAVE_AFTER:]
        assert rank["skip_first_batches"].startswith("raised")  # never a silently wrong DataLoader
