"""Train a tiny model with Hugging Face Accelerate, DDP on 2 CPU ranks (gloo), on an imgpipe loader used unchanged.

Run under Accelerate's launcher (it starts both ranks through torch.distributed.run; ``--cpu``
alone would start one process unless mpirun is given, so the ranks ask for the CPU themselves):
``accelerate launch --multi_gpu --num_processes 2 accelerate_ddp.py PACKED_DIR OUT_DIR BACKEND``.
The loaders go through ``accelerator.prepare`` with the model and optimizer, as any DataLoader
would, and their position is registered for ``save_state`` / ``load_state``. Each rank writes
what it saw (every train batch's labels and pixel sums, its evaluation labels, what
``gather_for_metrics`` gave, digests of the model's parameters, the batches after
``load_state``) to ``OUT_DIR/rank<r>.json``; the test checks them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

IMAGE_SIZE = 16
BATCH_SIZE = 4
SAVE_AFTER = 2  # epoch 1 saves the accelerator's state after this many steps


def make_loader(backend: str, data: str, train: bool):
    """The loader as a user writes it: no rank, world size or device (they come from Accelerate's environment)."""
    if backend == "torch":
        from imgpipe.loaders.torch import make_torch_loader

        return make_torch_loader(data, "train", batch_size=BATCH_SIZE, train=train, image_size=IMAGE_SIZE, workers=1)
    from imgpipe.loaders.dali import make_dali_loader

    return make_dali_loader(data, "train", batch_size=BATCH_SIZE, train=train, image_size=IMAGE_SIZE, workers=1)


def digest(model: torch.nn.Module) -> str:
    """sha256 of the parameters' bytes: equal digests are bitwise-equal parameters."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(data: str, out: Path, backend: str) -> None:
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    torch.manual_seed(rank)  # other initial weights on each rank: prepare must broadcast rank 0's
    model = torch.nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, 64)  # >= the test's labels
    report: dict = {"initial": digest(model)}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train, val = make_loader(backend, data, train=True), make_loader(backend, data, train=False)
    model, optimizer, prepared_train, prepared_val = accelerator.prepare(model, optimizer, train, val)
    report.update(
        prepared_unchanged=prepared_train is train and prepared_val is val,
        rank=rank,
        world_size=accelerator.num_processes,
        loader_rank=train.sampler.rank,
        loader_world_size=train.sampler.world_size,
        prepared=digest(accelerator.unwrap_model(model)),
    )
    accelerator.register_for_checkpointing(train)  # save_state / load_state keep the loader's position
    epochs = []
    for epoch in range(2):
        train.set_epoch(epoch)  # as a DistributedSampler wants it; the loader would run this epoch anyway
        model.train()
        batches = []
        for step, (images, labels) in enumerate(train):
            batches.append({"labels": labels.tolist(), "sums": images.double().sum(dim=(1, 2, 3)).tolist()})
            loss = torch.nn.functional.cross_entropy(model(images.flatten(1)), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if epoch == 1 and step == SAVE_AFTER - 1:
                accelerator.save_state(str(out / "checkpoint"))
                report["saved"] = digest(accelerator.unwrap_model(model))
        model.eval()
        seen: list[int] = []
        with torch.no_grad():
            for images, labels in val:
                model(images.flatten(1))
                seen += labels.tolist()
        # once, after the loop: the ranks' evaluation parts may differ by a record (and a batch)
        gathered = accelerator.gather_for_metrics(seen, use_gather_object=True)
        epochs.append({"train": batches, "val": seen, "val_gathered": gathered})
    report["epochs"] = epochs
    report["trained"] = digest(accelerator.unwrap_model(model))
    accelerator.wait_for_everyone()
    accelerator.load_state(str(out / "checkpoint"))  # the model of the save and the loader's position after step 2 of epoch 1
    report["restored"] = digest(accelerator.unwrap_model(model))
    report["resumed"] = [labels.tolist() for _, labels in train]
    try:
        accelerator.skip_first_batches(train, 1)  # rebuilds a torch DataLoader: not for imgpipe's loaders
        report["skip_first_batches"] = "returned"
    except Exception as e:  # noqa: BLE001 - the test wants to know that it did not pass silently
        report["skip_first_batches"] = f"raised {type(e).__name__}"
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    train.close()
    val.close()
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
