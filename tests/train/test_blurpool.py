"""model.blurpool: FFCV's BlurPoolConv2d on exactly the strided convolutions FFCV picks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision

from imgpipe.train.blurpool import BlurPoolConv2d, apply_blurpool


def test_resnet50_gets_the_blur_before_its_strided_convolutions_of_16_inputs_or_more() -> None:
    model = torchvision.models.resnet50(num_classes=10)
    strided = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Conv2d) and max(m.stride) > 1}
    assert apply_blurpool(model) == 6
    wrapped = {name for name, m in model.named_modules() if isinstance(m, BlurPoolConv2d)}
    # torchvision's ResNet-50 (v1.5) strides in conv2 of each layer's first block and in its downsample
    assert wrapped == {f"layer{i}.0.{part}" for i in (2, 3, 4) for part in ("conv2", "downsample.0")}
    assert strided == wrapped | {"conv1"}  # the stem (3 input channels) is left alone, as FFCV leaves it
    assert isinstance(model.conv1, torch.nn.Conv2d)
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    assert "layer2.0.conv2.blur_filter" in model.state_dict() and "layer2.0.conv2.conv.weight" in model.state_dict()


def test_the_wrapped_convolution_sees_its_input_blurred_by_the_binomial_filter() -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 8, 3, stride=2, padding=1)
    blurred = BlurPoolConv2d(conv)
    kernel = torch.tensor([1.0, 2.0, 1.0])
    assert torch.equal(blurred.blur_filter, (torch.outer(kernel, kernel) / 16).expand(16, 1, 3, 3))
    x = torch.randn(2, 16, 9, 9)
    by_hand = torch.zeros_like(x)
    padded = F.pad(x, (1, 1, 1, 1))
    for dy in range(3):
        for dx in range(3):
            by_hand += kernel[dy] * kernel[dx] / 16 * padded[:, :, dy : dy + 9, dx : dx + 9]
    torch.testing.assert_close(blurred(x), conv(by_hand))
    assert not torch.allclose(blurred(x), conv(x), atol=1e-2)  # the blur is really applied
    flat = torch.full((1, 16, 8, 8), 3.0)
    torch.testing.assert_close(F.conv2d(flat, blurred.blur_filter, padding=1, groups=16)[..., 1:-1, 1:-1], flat[..., 1:-1, 1:-1])
