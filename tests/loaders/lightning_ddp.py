"""Train a tiny model with PyTorch Lightning, DDP on 2 CPU ranks, on an imgpipe loader used unchanged.

Run as a script (Lightning's "ddp" strategy starts rank 1 by running this file again):
``python lightning_ddp.py PACKED_DIR OUT_DIR BACKEND``. Each rank writes the labels of every batch
it saw, per stage and epoch, to ``OUT_DIR/<stage>-<epoch>-rank<r>.txt``; the test checks them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch


class Tiny(L.LightningModule):
    def __init__(self, data: str, out: str, backend: str, image_size: int) -> None:
        super().__init__()
        self.data, self.out, self.backend, self.image_size = data, Path(out), backend, image_size
        self.model = torch.nn.Linear(3 * image_size * image_size, 64)  # >= the test's labels

    def _loader(self, train: bool):
        if self.backend == "torch":
            from imgpipe.loaders.torch import make_torch_loader

            return make_torch_loader(self.data, "train", batch_size=4, train=train, image_size=self.image_size, workers=1)
        from imgpipe.loaders.dali import make_dali_loader

        return make_dali_loader(self.data, "train", batch_size=4, train=train, image_size=self.image_size, workers=1)

    def train_dataloader(self):
        return self._loader(train=True)

    def val_dataloader(self):
        return self._loader(train=False)

    def _record(self, stage: str, labels: torch.Tensor) -> None:
        name = "sanity" if self.trainer.sanity_checking else f"{stage}-{self.current_epoch}"
        with open(self.out / f"{name}-rank{self.global_rank}.txt", "a") as f:
            f.write("".join(f"{label}\n" for label in labels.tolist()))

    def training_step(self, batch, _):
        images, labels = batch
        self._record("train", labels)
        return torch.nn.functional.cross_entropy(self.model(images.flatten(1)), labels)

    def validation_step(self, batch, _):
        images, labels = batch
        self._record("val", labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    data, out, backend = sys.argv[1:4]
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Tiny(data, out, backend, image_size=16))
