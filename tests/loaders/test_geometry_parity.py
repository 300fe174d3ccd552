"""The torch and DALI loaders share one geometry: same constants, and val outputs that agree.

Both decode with libjpeg-turbo (bit-identical pixels here) and both reproduce torchvision's
Resize(round(size / 0.875)) + CenterCrop(size) arithmetic (truncated long side, crop anchor
rounded half to even; the DALI loader computes it per sample). What remains is resampling:

* DALI vs torchvision (PIL) Resize + CenterCrop: per-image mean absolute difference (MAD)
  measured 0.12-0.18 in 0-255 units on the shared ``packed_dir`` val split at size 48
  (bilinear kernels rounding differently). Bound: 1.0.
* DALI vs the torch loader: the torch loader decodes reduced in the DCT domain (Pillow
  ``draft``) when the box shrinks 2x or more, which changes fine detail: measured per-image
  MAD 0.13-4.4 (the 3 drafted images are 1.8-4.4), split mean 0.8. Bounds: 9 per image, 3
  on average (about 2x and 4x margin).

Without the per-sample rounding (plain ``resize_shorter`` + ``crop_pos=0.5``) the one-pixel
offsets gave 5-15 on these high-detail images; a mirrored image or another record gives
more than 10, which the last assertions show the bounds would catch.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
import torchvision.transforms as T
from PIL import Image

from imgpipe.format.shardset import open_shardset
from imgpipe.loaders import geometry
from imgpipe.loaders.dali import dali_available, dali_geometry
from imgpipe.loaders.torch import make_torch_loader

SIZE = 48
MAX_REFERENCE_MAD = 1.0  # DALI vs torchvision Resize + CenterCrop, any image, 0-255 units
MAX_IMAGE_MAD = 9.0  # worst single image, 0-255 units
MAX_MEAN_MAD = 3.0  # mean over the split, 0-255 units
MIN_MISMATCH_MAD = 10.0  # what a geometry bug costs at least, to show the bounds can fail


def test_train_geometry_constants_are_shared() -> None:
    train = dali_geometry(224, train=True)
    torch_train = geometry.TrainGeometry(image_size=224)
    assert train["random_area"] == torch_train.scale == geometry.TRAIN_SCALE == (0.08, 1.0)
    assert train["random_aspect_ratio"] == torch_train.ratio == geometry.TRAIN_RATIO == (3 / 4, 4 / 3)
    assert train["flip_probability"] == torch_train.flip_p == geometry.FLIP_P == 0.5
    assert train["num_attempts"] == geometry.CROP_ATTEMPTS == 10
    assert train["crop"] == torch_train.image_size == 224
    # ... and they are torchvision's RandomResizedCrop / RandomHorizontalFlip defaults
    reference = T.RandomResizedCrop(224)
    assert tuple(reference.scale) == torch_train.scale and tuple(reference.ratio) == torch_train.ratio
    assert T.RandomHorizontalFlip().p == torch_train.flip_p
    assert reference.interpolation == T.InterpolationMode.BILINEAR and geometry.INTERPOLATION == "bilinear"

    val = dali_geometry(224, train=False)
    assert val["resize_shorter"] == geometry.EvalGeometry(image_size=224).resize_shorter == 256
    assert val["crop"] == 224 and geometry.EVAL_CROP_FRACTION == 0.875
    assert dali_geometry(160, train=False)["resize_shorter"] == round(160 / 0.875) == 183
    for args in (train, val):
        assert args["interpolation"] == "INTERP_LINEAR" and args["antialias"] is geometry.ANTIALIAS is True


@pytest.mark.dali
@pytest.mark.timeout(120)
@pytest.mark.skipif(not dali_available(), reason="nvidia.dali is not importable (pip install 'imgpipe[dali]')")
def test_val_outputs_of_both_loaders_agree(packed_dir: Path) -> None:
    from imgpipe.loaders.dali import make_dali_loader

    common = dict(batch_size=5, train=False, image_size=SIZE, normalize=False)
    torch_batches = list(make_torch_loader(packed_dir, "val", workers=0, **common))
    dali_batches = list(make_dali_loader(packed_dir, "val", workers=1, **common))
    ours = torch.cat([images for images, _ in torch_batches]).float()
    theirs = torch.cat([images for images, _ in dali_batches]).float()
    assert torch.equal(torch.cat([labels for _, labels in torch_batches]), torch.cat([labels for _, labels in dali_batches]))
    assert ours.shape == theirs.shape == (len(ours), 3, SIZE, SIZE)

    mad = (ours - theirs).abs().mean(dim=(1, 2, 3))
    assert float(mad.max()) < MAX_IMAGE_MAD, f"per-image MAD {mad.tolist()}"
    assert float(mad.mean()) < MAX_MEAN_MAD

    reference = T.Compose([T.Resize(round(SIZE / 0.875)), T.CenterCrop(SIZE), T.PILToTensor()])
    shards = open_shardset(packed_dir, "val")
    expected = torch.stack([reference(Image.open(io.BytesIO(shards.read(i)[1])).convert("RGB")) for i in range(len(shards))])
    to_reference = (theirs - expected.float()).abs().mean(dim=(1, 2, 3))
    assert float(to_reference.max()) < MAX_REFERENCE_MAD, f"per-image MAD to torchvision {to_reference.tolist()}"

    # the bounds discriminate: a mirrored image or the neighbouring record is far outside them
    mirrored = (ours - theirs.flip(-1)).abs().mean(dim=(1, 2, 3))
    shifted = (ours - theirs.roll(1, dims=0)).abs().mean(dim=(1, 2, 3))
    assert float(mirrored.mean()) > MIN_MISMATCH_MAD and float(shifted.min()) > MIN_MISMATCH_MAD
