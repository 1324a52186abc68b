"""What is done with the clients' example indices once they are partitioned (:mod:`lfed.data.partition`): held-out splits
for client-side evaluation (docs/algorithms.md §9), the server's validation split, the ``[N, max_n]`` packed index a
round gathers batches with, and per-client label counts; each in a list form (one tensor per client) and a flat one
(the clients' indices concatenated, with sizes: no ``N`` tensors at 100,000 clients). Also the seeded CPU generator
and the int check the partitioners share."""

from __future__ import annotations

import math
import operator

import torch
from torch import Tensor

from lfed.data.tensors import validate_labels

__all__ = [
    "checked_int", "flatten_indices", "holdout_split", "holdout_split_flat", "label_counts", "label_counts_flat", "pack_flat",
    "pack_indices", "seeded_generator", "validation_split",
]  # fmt: skip


def checked_int(name: str, value: object, minimum: int | None = None) -> int:
    """``value`` as a Python int (numpy ints too, not bools or floats), checked against ``minimum``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or (minimum is not None and number < minimum):
        raise ValueError(f"{name} must be an int{'' if minimum is None else f' >= {minimum}'}, got {value!r}")
    return number


def seeded_generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(checked_int("seed", seed))

def flatten_indices(client_indices: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Concatenate client index lists; return ``(flat, sizes)`` (one ``cat``: no per-client copy)."""
    if not isinstance(client_indices, (list, tuple)) or not client_indices \
            or not all(isinstance(t, Tensor) and t.dim() == 1 for t in client_indices):
        raise ValueError("client_indices must be a non-empty list of 1-D index tensors")
    sizes = torch.tensor([t.numel() for t in client_indices], dtype=torch.long)
    if all(t.dtype == torch.long for t in client_indices):
        return torch.cat(client_indices), sizes
    return torch.cat([t.long() for t in client_indices]), sizes


def holdout_split(client_indices: list[Tensor], fraction: float, seed: int = 0) -> tuple[list[Tensor], list[Tensor]]:
    """Hold out part of every client's examples for client-side evaluation (docs/algorithms.md §9).

    Client k holds out ``h_k = min(floor(fraction * n_k + 0.5), n_k - 1)``
    examples (rounded half up as everywhere in lfed, docs/algorithms.md §5) chosen uniformly
    at random, so it keeps at least one training example; ``fraction = 0``
    gives empty holdouts. Both parts keep the input order.

    Args:
        client_indices: One index tensor per client.
        fraction: Share held out, in ``[0, 1)``.
        seed: Seed of the choice.

    Returns:
        ``(train, holdout)``: two lists of index tensors, one per client.
    """
    flat, sizes = flatten_indices(client_indices)
    train, train_sizes, holdout, held = holdout_split_flat(flat, sizes, fraction, seed)
    return list(torch.split(train, train_sizes.tolist())), list(torch.split(holdout, held.tolist()))


def holdout_split_flat(flat: Tensor, sizes: Tensor, fraction: float, seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`holdout_split` of the clients' indices concatenated (``flat``, ``sizes [N]``).

    Returns:
        ``(train, train_sizes, holdout, holdout_sizes)``, concatenated the same way; equal to
        :func:`holdout_split`'s lists, without making ``N`` tensors (100,000 clients: ~0.1 s). With ``fraction = 0``
        nothing is drawn and ``train`` is ``flat`` itself, not a copy.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be a number in [0, 1), got {fraction!r}")
    device = flat.device
    if fraction == 0:  # nothing held out (what the draw below gives then, without drawing)
        return flat, sizes.clone(), flat[:0], torch.zeros_like(sizes)
    num_clients = sizes.numel()
    held = torch.floor(sizes.double() * fraction + 0.5).long().minimum((sizes - 1).clamp(min=0))
    owner = torch.repeat_interleave(torch.arange(num_clients), sizes)
    order = torch.randperm(flat.numel(), generator=seeded_generator(seed))
    order = order[torch.argsort(owner[order], stable=True)]  # grouped by client, random within client
    rank = torch.empty_like(order)
    # owner[order] is owner itself now (grouped by client, ascending, as owner is)
    rank[order] = torch.arange(flat.numel()) - (torch.cumsum(sizes, 0) - sizes)[owner]
    is_held = (rank < held[owner]).to(device)
    return flat[~is_held], sizes - held, flat[is_held], held


def pack_indices(client_indices: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Pack ragged client index lists into one padded matrix.

    Args:
        client_indices: ``N`` index tensors.

    Returns:
        ``(index, sizes)``: ``index`` is ``long [N, max_k n_k]`` with client k's
        indices in row k, padded with 0 after ``sizes[k]`` entries; ``sizes`` is
        ``long [N]``. Both on the device of the inputs.
    """
    flat, sizes = flatten_indices(client_indices)
    return pack_flat(flat, sizes), sizes.to(flat.device)


def pack_flat(flat: Tensor, sizes: Tensor) -> Tensor:
    """:func:`pack_indices` of the clients' indices concatenated (``flat``, ``sizes [N]``): ``index``."""
    num_clients = sizes.numel()
    width = int(sizes.max())
    owner = torch.repeat_interleave(torch.arange(num_clients), sizes.cpu())
    column = torch.arange(flat.numel()) - (torch.cumsum(sizes.cpu(), 0) - sizes.cpu())[owner]
    index = torch.zeros(num_clients, width, dtype=torch.long, device=flat.device)
    index[owner.to(flat.device), column.to(flat.device)] = flat
    return index


def label_counts(labels: Tensor, client_indices: list[Tensor], num_classes: int) -> Tensor:
    """Per-client label histogram (the statistic DWFed's weights use, docs/algorithms.md §3).

    Args:
        labels: ``[n]`` integer labels.
        client_indices: ``N`` index tensors into ``labels``.
        num_classes: ``C``.

    Returns:
        ``long [N, C]``: entry ``[k, j]`` counts client k's examples of class j.
    """
    validate_labels(labels, num_classes, "label_counts labels")
    flat, sizes = flatten_indices(client_indices)
    return _label_counts(labels, flat, sizes, num_classes)


def label_counts_flat(labels: Tensor, flat: Tensor, sizes: Tensor, num_classes: int) -> Tensor:
    """:func:`label_counts` of the clients' indices concatenated (``flat``, ``sizes [N]``)."""
    validate_labels(labels, num_classes, "label_counts labels")
    return _label_counts(labels, flat, sizes, num_classes)


def _label_counts(labels: Tensor, flat: Tensor, sizes: Tensor, num_classes: int) -> Tensor:
    owner = torch.repeat_interleave(torch.arange(sizes.numel(), device=labels.device), sizes.to(labels.device))
    key = owner * num_classes + labels[flat.to(labels.device)].long()
    return torch.bincount(key, minlength=sizes.numel() * num_classes).reshape(sizes.numel(), num_classes)


def validation_split(num_examples: int, fraction: float, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Set aside a share of the pooled training set as the server's validation set (docs/algorithms.md §9).

    The validation examples go to no client: hyper-parameters (a learning rate of a grid) are
    chosen on them, and the test set is only reported. ``v = floor(fraction * n + 0.5)``
    examples are drawn uniformly at random (seeded, rounded half up as everywhere in lfed).

    Args:
        num_examples: ``n``, the size of the pooled training set.
        fraction: Share set aside, in ``[0, 1)``; ``0`` gives an empty validation set.
        seed: Seed of the choice.

    Returns:
        ``(rest, validation)``: sorted positions of the examples the clients share, and of the
        validation examples.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation_fraction: must be a number in [0, 1), got {fraction!r}")
    v = int(math.floor(num_examples * fraction + 0.5))
    if fraction > 0 and v == 0:
        raise ValueError(f"validation_fraction: {fraction} of {num_examples} examples rounds to none; use a larger share or 0")
    order = torch.randperm(num_examples, generator=seeded_generator(seed))
    return order[v:].sort().values, order[:v].sort().values
