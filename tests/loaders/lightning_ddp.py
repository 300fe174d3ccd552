"""Train a tiny model with PyTorch Lightning, DDP on 2 CPU ranks, on an imgpipe loader used unchanged.

Run as a script (Lightning's "ddp" strategy starts rank 1 by running this file again):
``python lightning_ddp.py PACKED_DIR OUT_DIR BACKEND [save CKPT_DIR STEPS | resume CKPT_FILE | main]``.
Each rank writes the labels of every batch it saw, per stage and epoch, to
``OUT_DIR/<stage>-<epoch>-rank<r>.txt``; the test checks them.

* no mode: train 2 epochs, no checkpoint.
* ``save CKPT_DIR STEPS``: train 2 epochs and let ``ModelCheckpoint(every_n_train_steps=STEPS)``
  save a checkpoint every STEPS optimizer steps (the test resumes from one in the middle of epoch 1).
* ``resume CKPT_FILE``: a fresh launch: ``trainer.fit(ckpt_path=CKPT_FILE)`` to the end of epoch 2
  (3 epochs), on new loaders from ``train_dataloader()``: Lightning hands them the loader state it saved.
* ``main``: train 2 epochs on loaders built in ``__main__``, before the process group exists, and
  passed as ``trainer.fit(model, train_dataloaders=..., val_dataloaders=...)``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch

IMAGE_SIZE = 16


def make_loader(data: str, backend: str, train: bool):
    if backend == "torch":
        from imgpipe.loaders.torch import make_torch_loader

        return make_torch_loader(data, "train", batch_size=4, train=train, image_size=IMAGE_SIZE, workers=1)
    from imgpipe.loaders.dali import make_dali_loader

    return make_dali_loader(data, "train", batch_size=4, train=train, image_size=IMAGE_SIZE, workers=1)


class Tiny(L.LightningModule):
    """Records the labels of every batch; trains on the loaders passed to ``trainer.fit``."""

    def __init__(self, data: str, out: str, backend: str) -> None:
        super().__init__()
        self.data, self.out, self.backend = data, Path(out), backend
        self.model = torch.nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, 64)  # >= the test's labels

    def _record(self, stage: str, labels: torch.Tensor) -> None:
        name = "sanity" if self.trainer.sanity_checking else f"{stage}-{self.current_epoch}"
        with open(self.out / f"{name}-rank{self.global_rank}.txt", "a") as f:
            f.write("".join(f"{label}\n" for label in labels.tolist()))

    def on_train_start(self) -> None:
        # the train loader's position when training starts: after Lightning's load_state_dict on a resume
        state = self.trainer.train_dataloader.state_dict()
        state["num_training_batches"] = self.trainer.num_training_batches  # Lightning's len() of the loader
        (self.out / f"start-rank{self.global_rank}.json").write_text(json.dumps(state))

    def training_step(self, batch, _):
        images, labels = batch
        self._record("train", labels)
        return torch.nn.functional.cross_entropy(self.model(images.flatten(1)), labels)

    def validation_step(self, batch, _):
        images, labels = batch
        self._record("val", labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class TinyWithLoaders(Tiny):
    """Tiny that builds its loaders in Lightning's hooks, once the process group exists."""

    def train_dataloader(self):
        return make_loader(self.data, self.backend, train=True)

    def val_dataloader(self):
        return make_loader(self.data, self.backend, train=False)


if __name__ == "__main__":
    data, out, backend, *mode = sys.argv[1:]
    callbacks, ckpt_path, epochs, loaders = [], None, 2, {}
    if mode == ["main"]:  # Lightning's other pattern: loaders built here, before the process group exists
        loaders = {"train_dataloaders": make_loader(data, backend, train=True), "val_dataloaders": make_loader(data, backend, train=False)}
    elif mode and mode[0] == "save":
        from lightning.pytorch.callbacks import ModelCheckpoint

        callbacks = [ModelCheckpoint(dirpath=mode[1], filename="{step}", every_n_train_steps=int(mode[2]), save_top_k=-1)]
    elif mode and mode[0] == "resume":
        ckpt_path, epochs = mode[1], 3
    elif mode:
        sys.exit(f"unknown mode {mode}")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Tiny(data, out, backend) if loaders else TinyWithLoaders(data, out, backend)
    trainer.fit(model, ckpt_path=ckpt_path, **loaders)
