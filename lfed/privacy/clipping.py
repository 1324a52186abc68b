"""Per-client L2 clipping of a cohort's updates, all rows at once (SPEC §10)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["clip_rows"]


def clip_rows(updates: Tensor, clip: float | Tensor) -> tuple[Tensor, Tensor]:
    """``Δ̃_k = Δ_k · min(1, C / ‖Δ_k‖₂)`` for every row of ``[K, P]`` updates; the clipped rows and the norms.

    The norm is over the whole flat row (every trainable parameter). ``C = inf`` returns the rows
    unchanged (bit for bit); a zero row stays zero.
    """
    norms = torch.linalg.vector_norm(updates, dim=1)
    c = float(clip)
    if math.isinf(c):
        return updates, norms
    scale = torch.clamp(c / norms.clamp_min(torch.finfo(norms.dtype).tiny), max=1.0)
    return updates * scale[:, None], norms
