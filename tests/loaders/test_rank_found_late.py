"""A loader built before the process group exists finds its rank when it is used (Lightning's loaders built
in ``__main__``): real gloo process group over 2 processes, both backends."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from imgpipe.errors import ConfigError
from imgpipe.loaders.common import default_workers
from imgpipe.loaders.sampler import EpochSampler
from tests._packs import INDEXED_RECORDS as RECORDS  # one class per record: labels name the records

REPO = Path(__file__).resolve().parents[2]

RANK = """
import json, sys
import torch.distributed as dist

backend, data, port, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if backend == "torch":
    from imgpipe.loaders.torch import make_torch_loader as make
else:
    from imgpipe.loaders.dali import make_dali_loader as make
common = dict(batch_size=4, image_size=16, device="cpu")
train, val = make(data, **common), make(data, train=False, workers=1, **common)  # before the process group
fixed = make(data, rank=0, world_size=1, workers=1, **common)
report = {"len_before": len(train), "world_before": train.sampler.world_size}
train.set_epoch(1)
peek = iter(train)
next(peek)  # a look at epoch 1's first batch before the process group: that pass is this process's alone
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
report["train"] = [y.tolist() for _, y in train]  # the next epoch, on this rank's part of the stream
try:
    next(peek)
except Exception as error:
    report["peek"] = f"{type(error).__name__}: {error}"
report["val"] = [y.tolist() for _, y in val]
report.update(len_after=len(train), world_after=train.sampler.world_size, rank=train.sampler.rank, epoch=train.epoch,
              fixed_len=len(fixed), fixed_world=fixed.sampler.world_size,
              workers=train._loader.num_workers if backend == "torch" else train._spec.workers)
print(json.dumps(report), flush=True)
for loader in (train, val, fixed):
    loader.close()
dist.barrier()
dist.destroy_process_group()
"""


def make(backend: str, path: Path, **kwargs):
    if backend == "torch":
        from imgpipe.loaders.torch import make_torch_loader

        return make_torch_loader(path, **kwargs)
    from imgpipe.loaders.dali import make_dali_loader

    return make_dali_loader(path, **kwargs)


@pytest.mark.timeout(240)
def test_a_loader_built_before_the_process_group_reads_its_ranks_part(indexed: Path, backend: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE") and not k.startswith("SLURM_")
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, backend, str(indexed), str(port), str(rank)],
            # what Lightning's ddp launcher sets: WORLD_SIZE and LOCAL_RANK, not RANK, so nothing tells the rank yet
            env={**base, "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=200) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    reports = [json.loads(out) for out, _ in outs]
    for rank, report in enumerate(reports):
        assert (report["len_before"], report["world_before"]) == (RECORDS // 4, 1)  # this process alone, until the group exists
        assert (report["rank"], report["world_after"], report["len_after"]) == (rank, 2, RECORDS // 8)
        assert report["epoch"] == 2  # set_epoch(1) before the move holds after it, and the peeked pass counts as epoch 1
        assert report["peek"].startswith("ConfigError: this iterator's pass over the loader ended when the loader moved to rank")
        want = make(backend, indexed, batch_size=4, image_size=16, device="cpu", workers=1, rank=rank, world_size=2)
        want.set_epoch(2)
        assert report["train"] == [y.tolist() for _, y in want]  # its part of the global stream, exactly
        want.close()
        assert (report["fixed_len"], report["fixed_world"]) == (RECORDS // 4, 1)  # explicit rank and world_size hold
        assert report["workers"] == max(1, default_workers(2))  # set up again for 2 ranks on the node
    assert sorted(sum(reports[0]["val"] + reports[1]["val"], [])) == list(range(RECORDS))  # every sample once


def test_a_moved_sampler_keeps_its_place_in_the_global_stream() -> None:
    one = EpochSampler(48, batch_size=4, seed=3, rank=0, world_size=1)
    one.load_state_dict({**one.state_dict(), "epoch": 2, "batches": 6})  # 24 records of epoch 2 done
    two = one.moved(1, 2)
    assert (two.rank, two.world_size, two.state_dict()["epoch"], two.state_dict()["batches"]) == (1, 2, 2, 3)
    _, rest = two.begin_epoch()
    stream = np.concatenate(EpochSampler(48, batch_size=8, seed=3, rank=0, world_size=1).batches(2))
    assert np.array_equal(np.concatenate(rest), stream[24:].reshape(-1, 2, 4)[:, 1].ravel())
    one.load_state_dict({**one.state_dict(), "batches": 5})  # 20 records: not a whole number of global batches of 8
    with pytest.raises(ConfigError, match="cannot move the loader to rank 1 of 2 in the middle of epoch 2"):
        one.moved(1, 2)
    one.begin_epoch()
    one.mark_consumed()  # a pass under way (epoch 2, 6 batches in): it ends with the move, as an abandoned pass does
    after = one.moved(0, 2).state_dict()
    assert (after["epoch"], after["batches"]) == (3, 0)
