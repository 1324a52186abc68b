"""The attack role's contract (:mod:`lfed.base.attack`, re-exported here) and what the omniscient attacks share."""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.base.attack import Attack, NoAttack, byzantine_set, shared_copy

__all__ = ["Attack", "NoAttack", "byzantine_set", "honest_moments", "honest_rows", "shared_copy"]


def honest_rows(updates: Tensor, honest: Tensor, fallback: Tensor) -> Tensor:
    """The ``honest`` rows of ``updates``, or the ``fallback`` rows (the Byzantine clients' own honest updates) when the
    round has no honest row."""
    return updates.index_select(0, honest if honest.numel() else fallback)


def honest_moments(updates: Tensor, honest: Tensor, fallback: Tensor) -> tuple[Tensor, Tensor]:
    """The coordinate-wise mean and standard deviation (``n - 1`` in the denominator; 0 for one row) of the ``honest``
    rows, or of the ``fallback`` rows (the Byzantine clients' own honest updates) when the round has no honest row."""
    rows = honest_rows(updates, honest, fallback)
    std = rows.std(0, correction=1) if rows.shape[0] > 1 else torch.zeros_like(rows[0])
    return rows.mean(0), std
