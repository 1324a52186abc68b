"""A dataset as tensors (:class:`DatasetTensors`), label checks, inverted pixels and the cache of decoded datasets.

Shared by the dataset loaders of :mod:`lfed.data.datasets` and :mod:`lfed.data.leaf` and by
:mod:`lfed.lightning.datamodule` and :mod:`lfed.data.partition`; it imports none of them.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from lfed.state.atomic import write_atomically

__all__ = ["DatasetTensors", "cached_tensors", "inverted_pixels", "resolve_cache_dir", "source_key", "validate_labels"]

#: Version of the cache files' layout (part of every cache key).
CACHE_VERSION = "1"


@dataclass
class DatasetTensors:
    """A dataset's train and test splits as tensors.

    Attributes:
        name: Dataset name (one of :data:`lfed.data.datasets.DATASETS` or a user's name).
        train_x: Training inputs: ``float32 [n, C, H, W]`` images, or ``long [n, 80]``
            character indices for Shakespeare.
        train_y: Training labels, ``long [n]`` in ``[0, num_classes)``.
        test_x: Test inputs, same layout as ``train_x``.
        test_y: Test labels, ``long [m]``.
        num_classes: Number of classes ``C``; None for regression (floating targets).
        train_groups: ``long [n]`` natural client id (LEAF writer / role) of each
            training example, or ``None`` when the dataset has no natural partition.
        test_groups: ``long [m]`` natural client id of each test example, or ``None``.
    """

    name: str
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int | None
    train_groups: Tensor | None = None
    test_groups: Tensor | None = None

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            groups = getattr(self, f"{split}_groups")
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"{self.name}: {split}_x has {x.shape[0]} examples but {split}_y has {y.shape[0]}")
            if groups is not None and groups.shape != y.shape:
                raise ValueError(f"{self.name}: {split}_groups has shape {tuple(groups.shape)}, "
                                 f"expected {tuple(y.shape)} like {split}_y")
            if self.num_classes is not None:  # None: regression targets (floating)
                validate_labels(y, self.num_classes, f"{self.name} {split}")
            elif not y.dtype.is_floating_point:
                raise ValueError(f"{self.name}: num_classes is None (regression) but {split}_y is {y.dtype}, not floating")


def validate_labels(y: Tensor, num_classes: int, where: str) -> None:
    """Check that every label is an integer in ``[0, num_classes)``.

    Args:
        y: Label tensor of any shape and integer dtype.
        num_classes: Number of classes ``C >= 1``.
        where: What the labels are (e.g. ``"mnist train"``), named in the error.

    Raises:
        ValueError: If ``num_classes < 1``, ``y`` is not an integer tensor, or a
            label is ``< 0`` or ``>= num_classes`` (the message names ``where``
            and the first bad label).
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"{where}: num_classes must be an int >= 1, got {num_classes!r}")
    if not isinstance(y, Tensor) or y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        kind = y.dtype if isinstance(y, Tensor) else type(y).__name__
        raise ValueError(f"{where}: labels must be an integer tensor, got {kind}")
    if y.numel() == 0:
        return
    bad = (y < 0) | (y >= num_classes)
    if bool(bad.any()):
        first = int(y[bad].flatten()[0])
        raise ValueError(f"{where}: label {first} is outside [0, {num_classes}) "
                         f"({int(bad.sum())} bad label(s); num_classes={num_classes})")


def resolve_cache_dir() -> Path:
    """Where decoded datasets are cached: ``$LFED_CACHE_DIR``, else ``~/.cache/lfed/cache``.

    Returns:
        The cache directory as an expanded ``Path`` (created on first write).
    """
    return Path(os.environ.get("LFED_CACHE_DIR") or "~/.cache/lfed/cache").expanduser()


def source_key(tag: str, sources: list[Path]) -> str:
    """Cache key from the resolved path, size and mtime of every source file."""
    h = hashlib.sha256(f"{tag}/{CACHE_VERSION}".encode())
    for p in sorted(Path(s).resolve() for s in sources):
        st = p.stat()
        h.update(f"\n{p}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def cached_tensors(tag: str, sources: list[Path], build: Callable[[], dict]) -> dict:
    """Return ``build()``, cached with ``torch.save`` under :func:`resolve_cache_dir`.

    The cache file is keyed by ``tag`` and the path, size and mtime of ``sources``,
    written atomically; an unreadable cache file is rebuilt, and a cache directory
    that cannot be written only costs a warning.

    Args:
        tag: Short name of what is cached (e.g. ``"femnist"``).
        sources: Files the result is decoded from.
        build: Decodes the sources into a dict of tensors (and plain Python values).

    Returns:
        The dict, from the cache when possible.
    """
    path = resolve_cache_dir() / f"{tag}-{source_key(tag, sources)}.pt"
    if path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged cache file is rebuilt below
            pass
    obj = build()
    try:
        write_atomically(path, lambda fh: torch.save(obj, fh), mode=0o644)
    except OSError as err:
        warnings.warn(f"could not write dataset cache {path}: {err}", stacklevel=2)
    return obj


def inverted_pixels(ds: DatasetTensors) -> DatasetTensors:
    """``ds`` with inputs ``1 - x`` (new tensors: a loaded dataset may be shared by other modules)."""
    for part, x in (("train", ds.train_x), ("test", ds.test_x)):
        if not x.is_floating_point():
            raise ValueError(f"invert_pixels: {ds.name}'s {part} inputs are {x.dtype}, not pixels; "
                             "only floating inputs in [0, 1] can be inverted")
        if x.numel() and (float(x.min()) < 0 or float(x.max()) > 1):
            raise ValueError(f"invert_pixels: {ds.name}'s {part} inputs span [{float(x.min()):g}, {float(x.max()):g}], "
                             "not [0, 1]; 1 - x would not be an image of the same range")
    return replace(ds, train_x=1 - ds.train_x, test_x=1 - ds.test_x)
