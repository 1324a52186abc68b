"""A user's own data read into checked tensors: ``(x, y)`` tensors, a ``TensorDataset`` or a map-style ``Dataset`` of
``(input, target)`` pairs, as :class:`~lfed.data.federated.FederatedDataset`'s ``train`` and ``test`` take them
(:func:`as_tensors`); a mistake gets one message naming the split and what lfed reads."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

__all__ = ["as_tensors"]

NOT_PAIR = ("{what}: item 0 of the Dataset is {kind}; lfed reads a Dataset of (input, target) pairs. "
             "Wrap it so that dataset[i] returns (x, y)")


def item_tensor(value, what: str, part: str) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if type(value).__module__.startswith("PIL"):
        raise ValueError(
            f"{what}: the Dataset's {part} are PIL images ({type(value).__name__}); lfed needs tensors: give the "
            "dataset a transform that makes tensors, e.g. transform=torchvision.transforms.ToTensor()"
        )
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{what}: the Dataset's {part} must be tensors or numbers, got {type(value).__name__} ({e})") from None


def dataset_tensors(data: Dataset, what: str) -> tuple[Tensor, Tensor]:
    """Read a map-style Dataset of (x, y) pairs into two tensors, once (see FederatedDataset's docstring)."""
    try:
        n = len(data)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{what}: the Dataset has no length; lfed reads a map-style Dataset of (x, y) pairs") from None
    if n == 0:
        raise ValueError(f"{what}: the dataset is empty (0 examples)")
    first = data[0]
    if isinstance(first, dict):
        raise ValueError(NOT_PAIR.format(what=what, kind=f"a dict with keys {sorted(map(str, first))}"))
    if not isinstance(first, (tuple, list)) or len(first) != 2:
        kind = f"a {type(first).__name__}" + (f" of {len(first)} parts" if isinstance(first, (tuple, list)) else "")
        raise ValueError(NOT_PAIR.format(what=what, kind=kind))
    again = data[0]
    x0, x1 = item_tensor(first[0], what, "inputs"), item_tensor(again[0], what, "inputs")
    if x0.shape != x1.shape or not torch.equal(x0, x1):
        warnings.warn(
            f"{what}: the Dataset returns a different input each time item 0 is read (a random transform or "
            "augmentation?). lfed reads the Dataset once into tensors, so each example keeps the one draw it got "
            "now for the whole run: augmentation is frozen, not redrawn per round. Give the Dataset without its random "
            "transform and set augment (data.augment: crop_flip, or an lfed.data.augment.Augmentation) to redraw "
            "it on the device at every local step.",
            UserWarning, stacklevel=4,
        )
    items = [first] + [data[i] for i in range(1, n)]
    x = torch.stack([item_tensor(it[0], what, "inputs") for it in items])
    y = torch.stack([item_tensor(it[1], what, "targets") for it in items])
    return x, y


def as_tensors(data: tuple[Tensor, Tensor] | Dataset, what: str) -> tuple[Tensor, Tensor]:
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
        x, y = data
    elif isinstance(data, TensorDataset) and len(data.tensors) == 2:
        x, y = data.tensors
    elif isinstance(data, Dataset):
        x, y = dataset_tensors(data, what)
    else:
        raise ValueError(f"{what}: expected (x, y) tensors or a torch Dataset of (x, y) pairs, got {type(data).__name__}")
    if x.dim() == 0 or y.dim() == 0:
        raise ValueError(f"{what}: inputs and targets need one row per example, got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{what}: {x.shape[0]} inputs but {y.shape[0]} labels")
    if x.shape[0] == 0:
        raise ValueError(f"{what}: the dataset is empty (0 examples)")
    if not (x.is_floating_point() or x.dtype == torch.long):
        raise ValueError(
            f"{what}: inputs of dtype {x.dtype}; lfed takes floating inputs (features, pixels) or int64 token ids "
            f"(for an embedding). Convert them, e.g. x.float() / 255 for uint8 pixels"
        )
    if y.dtype == torch.bool or y.dtype.is_complex:
        raise ValueError(f"{what}: targets of dtype {y.dtype}; give integer class labels (classification) "
                         "or floating targets (regression)")
    if y.dtype.is_floating_point:
        if y.dim() == 1:
            y = y[:, None]  # one regression target per example: a column, as a net with one output gives
    else:
        y = y.long()
    return x, y
