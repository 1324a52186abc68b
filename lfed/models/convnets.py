"""The papers' convolutional image models: McMahan et al. 2017's MNIST and CIFAR CNNs, Reddi et al. 2021's EMNIST CNN,
and a small CNN for 8x8 digits. Parameter counts are worked out in each docstring (held by ``tests/models/test_zoo.py``);
the catalogue of every model by name: :mod:`lfed.models.zoo`."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from lfed.checks import integer

__all__ = ["McMahanMNISTCNN", "McMahanCIFARCNN", "ReddiEMNISTCNN", "SmallCNN"]


def _as_images(x: Tensor, channels: int, height: int, width: int) -> Tensor:
    """Reshape ``[B, *sample_shape]`` to ``[B, C, H, W]`` (sample numel must be C*H*W)."""
    return x.reshape(x.shape[0], channels, height, width)

class McMahanMNISTCNN(nn.Module):
    """McMahan et al. 2017's MNIST "CNN".

    Paper (§3): "A CNN with two 5x5 convolution layers (the first with 32
    channels, the second with 64, each followed with 2x2 max pooling), a fully
    connected layer with 512 units and ReLu activation, and a final softmax
    output layer (1,663,370 total parameters)." The quoted count is reached
    exactly with "same" convolutions (padding 2) on 28x28 inputs, so the
    poolings take 28 -> 14 -> 7 (TensorFlow Federated's
    ``create_original_fedavg_cnn_model`` is the same network). ReLU follows each
    convolution.

    Parameter count (in_channels=1, num_classes=10):

    - conv1 ``5*5*1*32 + 32 = 832``
    - conv2 ``5*5*32*64 + 64 = 51,264``
    - fc1 ``7*7*64*512 + 512 = 1,606,144``
    - fc2 ``512*10 + 10 = 5,130``
    - total ``1,663,370``

    Args:
        in_channels: Image channels; each sample is reshaped to
            ``[in_channels, 28, 28]``.
        num_classes: Number of output logits (10 for MNIST, 62 for EMNIST).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        integer("in_channels", in_channels, at_least=1)
        integer("num_classes", num_classes, at_least=1)
        self.in_channels = in_channels
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)
        self.fc1 = nn.Linear(7 * 7 * 64, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, num_classes]`` for input ``[B, *sample_shape]`` (28x28 images)."""
        x = _as_images(x, self.in_channels, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def _tf_same_max_pool_3x3_s2(x: Tensor) -> Tensor:
    """TensorFlow ``max_pool(ksize=3, strides=2, padding='SAME')`` on ``[B, C, H, W]``.

    TF pads ``max((ceil(n/2) - 1) * 2 + 3 - n, 0)`` positions per spatial axis,
    the smaller half before and the larger half after, with -inf; PyTorch's
    ``padding=1`` would pad symmetrically and shift the windows by one.
    """
    pads: list[int] = []
    for n in (x.shape[-1], x.shape[-2]):  # F.pad order: last dim first
        total = max((math.ceil(n / 2) - 1) * 2 + 3 - n, 0)
        pads += [total // 2, total - total // 2]
    x = F.pad(x, pads, value=float("-inf"))
    return F.max_pool2d(x, kernel_size=3, stride=2)


class McMahanCIFARCNN(nn.Module):
    """The TensorFlow CIFAR-10 tutorial model that McMahan et al. 2017 used.

    McMahan et al. 2017 (§3, CIFAR experiments): "The model architecture was
    taken from the TensorFlow tutorial, which consists of two convolutional
    layers followed by two fully connected layers and then a linear
    transformation layer to produce logits, for a total of about 10^6
    parameters." The tutorial (``cifar10.py``, ``inference``) is::

        conv1 5x5x3x64 SAME + ReLU -> max_pool 3x3/2 SAME -> LRN
        conv2 5x5x64x64 SAME + ReLU -> LRN -> max_pool 3x3/2 SAME
        local3 FC 384 + ReLU -> local4 FC 192 + ReLU -> softmax_linear FC 10

    with LRN ``depth_radius=4, bias=1.0, alpha=0.001/9, beta=0.75``, which is
    ``nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0)`` (PyTorch
    divides alpha by the window size, TF does not). Pooling follows TF's SAME
    alignment (padding after, not both sides).

    The paper trains on 24x24 crops; lfed's default is the full 32x32 image
    (``image_size=32``), which changes only local3's input width
    (``64 * ceil(ceil(s/2)/2)**2``).

    Parameter count (num_classes=10):

    - conv1 ``5*5*3*64 + 64 = 4,864``; conv2 ``5*5*64*64 + 64 = 102,464``
    - local3, 32x32 input: ``8*8*64*384 + 384 = 1,573,248``;
      24x24 input: ``6*6*64*384 + 384 = 885,120``
    - local4 ``384*192 + 192 = 73,920``; logits ``192*10 + 10 = 1,930``
    - total: **1,756,426** at 32x32, **1,068,298** at 24x24 (the paper's "about
      10^6").

    Args:
        num_classes: Number of output logits.
        image_size: Side of the square RGB input; samples are reshaped to
            ``[3, image_size, image_size]``.
        lrn: Keep the tutorial's local response normalisation layers (they have
            no parameters); ``False`` drops them.
    """

    def __init__(self, num_classes: int = 10, image_size: int = 32, lrn: bool = True) -> None:
        super().__init__()
        integer("num_classes", num_classes, at_least=1)
        integer("image_size", image_size, at_least=1)
        self.image_size = image_size
        self.use_lrn = bool(lrn)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(64, 64, kernel_size=5, padding=2)
        self.norm = nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0)
        side = math.ceil(math.ceil(image_size / 2) / 2)
        self.fc1 = nn.Linear(side * side * 64, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, num_classes]`` for input ``[B, *sample_shape]`` (3 x s x s images)."""
        x = _as_images(x, 3, self.image_size, self.image_size)
        x = _tf_same_max_pool_3x3_s2(F.relu(self.conv1(x)))
        if self.use_lrn:
            x = self.norm(x)
        x = F.relu(self.conv2(x))
        if self.use_lrn:
            x = self.norm(x)
        x = _tf_same_max_pool_3x3_s2(x)
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class ReddiEMNISTCNN(nn.Module):
    """Reddi et al. 2021 (Adaptive Federated Optimization) EMNIST CNN.

    Reddi et al. 2021, appendix (EMNIST character-recognition model):
    Conv2d 3x3 32 (valid) -> Conv2d 3x3 64 (valid) -> MaxPool 2x2 ->
    Dropout 0.25 -> Flatten -> Dense 128 -> Dropout 0.5 -> Dense 62; ReLU after both convolutions and
    the 128-unit layer (as in TensorFlow Federated's
    ``create_conv_dropout_model``). 28x28 inputs: 28 -> 26 -> 24 -> pool 12.

    Parameter count (num_classes=62):

    - conv1 ``3*3*1*32 + 32 = 320``
    - conv2 ``3*3*32*64 + 64 = 18,496``
    - fc1 ``12*12*64*128 + 128 = 1,179,776``
    - fc2 ``128*62 + 62 = 7,998``
    - total ``1,206,590`` (with num_classes=10: ``1,199,882``)

    Args:
        num_classes: Number of output logits (62 for EMNIST "byclass").
        dropout: Keep the two dropout layers; ``False`` removes them (the
            parameter count is the same). In training mode under ``vmap``
            dropout needs ``randomness="different"``.
    """

    def __init__(self, num_classes: int = 62, dropout: bool = True) -> None:
        super().__init__()
        integer("num_classes", num_classes, at_least=1)
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.drop1: nn.Module = nn.Dropout(0.25) if dropout else nn.Identity()
        self.fc1 = nn.Linear(12 * 12 * 64, 128)
        self.drop2: nn.Module = nn.Dropout(0.5) if dropout else nn.Identity()
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, num_classes]`` for input ``[B, *sample_shape]`` (28x28 images)."""
        x = _as_images(x, 1, 28, 28)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.drop1(F.max_pool2d(x, 2))
        x = self.drop2(F.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)

class SmallCNN(nn.Module):
    """A small CNN for scikit-learn's 8x8 digits (fast end-to-end tests).

    conv 3x3 16 (pad 1) + ReLU -> max-pool 2 (8 -> 4) -> conv 3x3 32 (pad 1) +
    ReLU -> max-pool 2 (4 -> 2) -> linear to ``num_classes``.

    Parameter count (num_classes=10): ``3*3*1*16 + 16 = 160``;
    ``3*3*16*32 + 32 = 4,640``; ``2*2*32*10 + 10 = 1,290``; total ``6,090``.

    Args:
        num_classes: Number of output logits.
        in_channels: Image channels; samples are reshaped to ``[in_channels, 8, 8]``.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        integer("num_classes", num_classes, at_least=1)
        integer("in_channels", in_channels, at_least=1)
        self.in_channels = in_channels
        self.conv1 = nn.Conv2d(in_channels, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc = nn.Linear(2 * 2 * 32, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, num_classes]`` for input ``[B, *sample_shape]`` (8x8 images)."""
        x = _as_images(x, self.in_channels, 8, 8)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))
