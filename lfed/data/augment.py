"""Augmentation redrawn every local step, on the device, inside the vmapped cohort.

lfed reads a dataset once into tensors, so a ``Dataset``'s random transform would be drawn once
and frozen. An :class:`Augmentation` instead transforms each mini-batch of every local step,
with per-example random parameters drawn for the whole round at once:

* :meth:`Augmentation.draw` makes the parameters of every ``(client, step, example)`` of a
  round's batch schedule ``[K, T, B]`` from the round's seeded generator (on the host), so the
  vmap and loop backends, CPU and GPU, a grid's runs and a resumed run see the same draws; every
  client, step and example draws its own;
* :meth:`Augmentation.apply` transforms a batch ``x [*lead, C, H, W]`` with the parameters of
  its examples (``[*lead, ...]``): a function of the example and its own parameters alone, so
  applying it to a whole ``[K, B]`` batch (vmap) equals applying it to each client's ``[B]``
  (loop), bit for bit.

Built in (``data.augment``): ``crop_flip`` (:class:`RandomCrop` with padding 4 then
:class:`HorizontalFlip`, the CIFAR recipe of He et al. 2016, §4.2), or any list of
:class:`RandomCrop`, :class:`HorizontalFlip` and your own subclasses in :class:`Compose`.
Evaluation never augments.

Your own transform is a subclass (give it as ``data.augment: {class_path: mymodule.Brightness}``): ``draw``
makes one set of parameters per example from the generator, ``apply`` uses them on any leading shape:

>>> import torch
>>> class Brightness(Augmentation):
...     def __init__(self, scale: float = 0.2):
...         self.scale = scale
...     def draw(self, lead, image, generator):
...         return {"gain": 1 + self.scale * (2 * torch.rand(lead, generator=generator, dtype=torch.float64) - 1)}
...     def apply(self, x, params):
...         return x * params["gain"].to(x).view(*params["gain"].shape, 1, 1, 1)
>>> aug = Brightness()
>>> params = aug.draw((2, 3, 4), (1, 8, 8), torch.Generator().manual_seed(0))  # 2 clients, 3 steps, batches of 4
>>> aug.apply(torch.ones(2, 3, 4, 1, 8, 8), params).shape
torch.Size([2, 3, 4, 1, 8, 8])
>>> bool(aug.apply(torch.ones(4, 1, 8, 8), {"gain": params["gain"][1, 2]})[3].eq(params["gain"][1, 2, 3]).all())
True
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["AUGMENTATIONS", "Augmentation", "Compose", "HorizontalFlip", "RandomCrop", "build_augmentation"]


class Augmentation:
    """A random transform of image batches, its randomness drawn per example (module docstring).

    A subclass defines :meth:`draw` and :meth:`apply`; both work on any leading shape.
    """

    def draw(self, lead: tuple[int, ...], image: tuple[int, ...], generator: torch.Generator) -> dict[str, Tensor]:
        """The parameters of ``lead`` (``(K, T, B)``) examples of shape ``image`` (``(C, H, W)``), on the host."""
        raise NotImplementedError

    def apply(self, x: Tensor, params: dict[str, Tensor]) -> Tensor:
        """``x [*lead, C, H, W]`` transformed with its examples' ``params`` (each ``[*lead, ...]``, on ``x``'s device)."""
        raise NotImplementedError

    def check(self, image: tuple[int, ...]) -> None:
        """Refuse inputs this transform cannot apply to (before round 0): images ``[C, H, W]``."""
        if len(image) != 3:
            raise ValueError(f"data.augment: {type(self).__name__} transforms images [C, H, W]; the inputs are "
                             f"{list(image)} (augment only image data)")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class RandomCrop(Augmentation):
    """torchvision's ``RandomCrop(size=(H, W), padding)``: zero-pad every side by ``padding``, then take the
    ``H x W`` window at a uniform offset ``(i, j) ∈ {0..2p}²`` drawn per example."""

    def __init__(self, padding: int = 4) -> None:
        if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
            raise ValueError(f"padding: an integer >= 0, got {padding!r}")
        self.padding = padding

    def draw(self, lead, image, generator):
        return {"crop": torch.randint(0, 2 * self.padding + 1, (*lead, 2), generator=generator)}

    def apply(self, x, params):
        p = self.padding
        if p == 0:
            return x
        H, W = x.shape[-2:]
        padded = torch.nn.functional.pad(x, (p, p, p, p))
        off = params["crop"].to(x.device)
        lead = x.shape[:-3]
        rows = (off[..., 0, None] + torch.arange(H, device=x.device))  # [*lead, H]
        cols = (off[..., 1, None] + torch.arange(W, device=x.device))  # [*lead, W]
        C = x.shape[-3]
        r = rows[..., None, :, None].expand(*lead, C, H, W + 2 * p)
        out = padded.gather(-2, r)  # [*lead, C, H, W + 2p]
        c = cols[..., None, None, :].expand(*lead, C, H, W)
        return out.gather(-1, c)


class HorizontalFlip(Augmentation):
    """torchvision's ``RandomHorizontalFlip(p)``: each example mirrored left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"p: a probability in [0, 1], got {p!r}")
        self.p = float(p)

    def draw(self, lead, image, generator):
        return {"flip": torch.rand(lead, generator=generator, dtype=torch.float64) < self.p}

    def apply(self, x, params):
        flip = params["flip"].to(x.device).view(*params["flip"].shape, *[1] * 3)
        return torch.where(flip, x.flip(-1), x)


class Compose(Augmentation):
    """Several transforms in order; each draws its own parameters (in order, from the one generator)."""

    def __init__(self, transforms: Sequence[Augmentation]) -> None:
        transforms = list(transforms)
        for t in transforms:
            if not isinstance(t, Augmentation):
                raise ValueError(f"transforms: each must be an lfed.data.augment.Augmentation, got {type(t).__name__}")
        self.transforms = transforms

    def check(self, image):
        for t in self.transforms:
            t.check(image)

    def draw(self, lead, image, generator):
        return {f"{i}.{k}": v for i, t in enumerate(self.transforms) for k, v in t.draw(lead, image, generator).items()}

    def apply(self, x, params):
        for i, t in enumerate(self.transforms):
            x = t.apply(x, {k.split(".", 1)[1]: v for k, v in params.items() if k.split(".", 1)[0] == str(i)})
        return x


#: The named augmentations of ``data.augment``.
AUGMENTATIONS = {
    "none": lambda: None,
    "crop_flip": lambda: Compose([RandomCrop(4), HorizontalFlip(0.5)]),
    "flip": lambda: HorizontalFlip(0.5),
    "crop": lambda: RandomCrop(4),
}


def build_augmentation(value) -> Augmentation | None:
    """``data.augment``: None, a name of :data:`AUGMENTATIONS`, an :class:`Augmentation`, or the dotted path of an
    :class:`Augmentation` class built with its defaults (``--data.augment mymodule.Brightness``)."""
    if value is None or isinstance(value, Augmentation):
        return value
    if isinstance(value, str) and value in AUGMENTATIONS:
        return AUGMENTATIONS[value]()
    if isinstance(value, str) and "." in value:
        module, _, name = value.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"augment: {value!r} does not import ({type(err).__name__}: {err})") from None
        if not (isinstance(cls, type) and issubclass(cls, Augmentation)):
            raise ValueError(f"augment: {value!r} is not an lfed.data.augment.Augmentation subclass")
        return cls()
    close = difflib.get_close_matches(str(value), list(AUGMENTATIONS), n=1)
    raise ValueError(f"augment: {value!r} is not one of {', '.join(AUGMENTATIONS)} or an lfed.data.augment.Augmentation"
                     + (f" (did you mean {close[0]!r}?)" if close else ""))


def select(params: dict[str, Tensor] | None, rows) -> dict[str, Tensor] | None:
    """The parameters of some rows (an index or slice of the leading client dimension)."""
    return None if params is None else {k: v[rows] for k, v in params.items()}
