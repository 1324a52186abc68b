"""ResNets for federated vision: the CIFAR ResNet-20 of He et al. 2016 (in its paper's form or with projection
shortcuts) and torchvision's ResNet-18, each with BatchNorm or GroupNorm.

Both train on the vmap backend (BatchNorm's running statistics are each client's own row,
:mod:`lfed.engine.norm`) and on the loop backend. GroupNorm keeps no running statistics, the
choice Hsieh, Phanishayee, Mutlu, Gibbons (ICML 2020, "The Non-IID Data Quagmire of Decentralized
Machine Learning", §5) recommend for non-IID data, with 2 groups as in their experiments
(``groups``). The parameter counts are held exactly by ``tests/models/test_resnet.py``:

* :class:`ResNet20` (``depth = 6n + 2``, §4.2 of He et al.: a 3x3 stem of ``width`` channels, three
  stages of ``n`` basic blocks at ``width``, ``2·width`` and ``4·width`` channels). Its ``shortcut`` where a
  stage halves the map and doubles the channels: ``projection`` (the default) a 1x1 stride-2 convolution with a
  norm, the paper's option B, which it uses on ImageNet: 272,474 parameters with the defaults (depth 20, width
  16, 3 input channels, 10 classes), 272,186 with one input channel; or ``identity``, the paper's option A, which
  §4.2 uses on CIFAR ("we use identity shortcuts in all cases (i.e., option A)"): the input taken every second
  pixel and zero channels appended (parameter-free, fb.resnet.torch's ``shortcutType A``): 269,722 parameters,
  269,434 with one input channel — the network of the paper's CIFAR table.
* :class:`ResNet18` (torchvision's ``resnet18``): 11,689,512 parameters for ImageNet (1,000
  classes); with ``stem="cifar"`` (a 3x3, stride-1 first convolution and no max-pooling, the
  variant FL papers train on 32x32 images) and 10 classes 11,173,962.

GroupNorm has the same affine parameters as BatchNorm, so the counts hold for both norms.
Inputs are ``[B, C, H, W]`` (``[B, H, W]`` is read as one channel); any image size works
(global average pooling before the classifier).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn
from torch.nn import functional as F

from lfed.checks import integer

__all__ = ["NORMS", "SHORTCUTS", "ResNet18", "ResNet20"]

NORMS = ("batch", "group")
SHORTCUTS = ("projection", "identity")


def _norm(kind: str, groups: int):
    """A constructor ``channels -> norm layer``."""
    if kind not in NORMS:
        raise ValueError(f"norm: {kind!r} is not one of {NORMS}")
    integer("groups", groups, at_least=1)
    if kind == "batch":
        return nn.BatchNorm2d

    def group_norm(channels: int) -> nn.GroupNorm:
        if channels % groups:
            raise ValueError(f"groups: {groups} groups must divide every layer's channels, but a layer has {channels}")
        return nn.GroupNorm(groups, channels)

    return group_norm


def _images(x: Tensor) -> Tensor:
    return x.unsqueeze(-3) if x.dim() == 3 else x


class PadShortcut(nn.Module):
    """He et al. 2016's option A shortcut: the identity, subsampled by ``stride`` (every ``stride``-th pixel, as a
    1x1 stride-``stride`` pooling: fb.resnet.torch's ``shortcutType A``) with ``cout - cin`` zero channels appended.
    No parameters."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.extra, self.stride = cout - cin, stride

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x[..., :: self.stride, :: self.stride], (0, 0, 0, 0, 0, self.extra))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm, shortcut: str = "projection") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = norm(cout)
        if stride == 1 and cin == cout:
            self.shortcut = nn.Identity()
        elif shortcut == "identity":
            self.shortcut = PadShortcut(cin, cout, stride)
        else:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn1(self.conv1(x)).relu()
        out = self.bn2(self.conv2(out))
        return (out + self.shortcut(x)).relu()


class ResNet20(nn.Module):
    """The CIFAR ResNet of He et al. 2016, §4.2, of ``depth = 6n + 2`` layers (module docstring; 20 by default):
    with ``shortcut="identity"`` the paper's network (option A), with ``projection`` (the default) its option-B variant.

    Args:
        num_classes: Outputs.
        in_channels: Input channels (3 for CIFAR, 1 for (E)MNIST/FEMNIST).
        depth: ``6n + 2`` (20, 32, 44, 56, 110).
        width: Channels of the first stage (16 in the paper).
        norm: ``batch`` (BatchNorm with running statistics) or ``group`` (GroupNorm).
        groups: GroupNorm's groups (``norm: group``).
        shortcut: Where a stage halves the map and doubles the channels: ``projection`` (option B: a 1x1 stride-2
            convolution and a norm) or ``identity`` (option A, the paper's CIFAR choice: subsampled, zero-padded,
            parameter-free; :class:`PadShortcut`).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, depth: int = 20, width: int = 16,
                 norm: Literal["batch", "group"] = "batch", groups: int = 2,
                 shortcut: Literal["projection", "identity"] = "projection") -> None:
        super().__init__()
        for name, value in (("num_classes", num_classes), ("in_channels", in_channels), ("width", width)):
            integer(name, value, at_least=1)
        integer("depth", depth, at_least=8)
        if (depth - 2) % 6:
            raise ValueError(f"depth: 6n + 2 (20, 32, 44, 56, 110), got {depth}")
        if shortcut not in SHORTCUTS:
            raise ValueError(f"shortcut: {shortcut!r} is not one of {SHORTCUTS} (projection: option B; identity: "
                             "option A, He et al.'s CIFAR network)")
        make = _norm(norm, groups)
        n = (depth - 2) // 6
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), make(width), nn.ReLU())
        blocks, cin = [], width
        for stage, cout in enumerate((width, 2 * width, 4 * width)):
            for i in range(n):
                blocks.append(_BasicBlock(cin, cout, 2 if stage > 0 and i == 0 else 1, make, shortcut))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.blocks(self.stem(_images(x)))
        return self.fc(out.mean((-2, -1)))


class ResNet18(nn.Module):
    """torchvision's ResNet-18 (module docstring), with BatchNorm or GroupNorm.

    Args:
        num_classes: Outputs.
        in_channels: Input channels.
        norm: ``batch`` or ``group``.
        groups: GroupNorm's groups (``norm: group``).
        stem: ``imagenet`` (torchvision's 7x7 stride-2 convolution and max-pooling) or ``cifar`` (a 3x3 stride-1
            convolution, no max-pooling: for 28x28 or 32x32 images).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, norm: Literal["batch", "group"] = "batch",
                 groups: int = 2, stem: Literal["imagenet", "cifar"] = "cifar") -> None:
        super().__init__()
        from torchvision.models import resnet18  # torchvision's import is slow: only for this model

        integer("num_classes", num_classes, at_least=1)
        integer("in_channels", in_channels, at_least=1)
        if stem not in ("imagenet", "cifar"):
            raise ValueError(f"stem: {stem!r} is not one of ('imagenet', 'cifar')")
        net = resnet18(num_classes=num_classes, norm_layer=_norm(norm, groups))
        if stem == "cifar":
            net.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
            net.maxpool = nn.Identity()
        elif in_channels != 3:
            net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(_images(x))
