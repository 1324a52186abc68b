"""Per-client L2 clipping of a cohort's updates, all rows at once (docs/algorithms.md §11)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["clip_factors", "clip_rows"]


def clip_factors(norms: Tensor, clip: float | Tensor) -> Tensor:
    """``min(1, C / ‖Δ_k‖)`` per row (1 for a zero row; all ones for ``C = inf``), in the norms' dtype.

    ``clip``: a float, or a 0-dim tensor on the norms' device (adaptive clipping's bound, never read to the
    host: a finite bound is divided as is, an infinite one gives ones, as the float does).
    """
    if isinstance(clip, Tensor):
        return torch.clamp(clip.to(norms.dtype) / norms.clamp_min(torch.finfo(norms.dtype).tiny), max=1.0)
    if math.isinf(float(clip)):
        return torch.ones_like(norms)
    return torch.clamp(float(clip) / norms.clamp_min(torch.finfo(norms.dtype).tiny), max=1.0)


def clip_rows(updates: Tensor, clip: float | Tensor) -> tuple[Tensor, Tensor]:
    """``Δ̃_k = Δ_k · min(1, C / ‖Δ_k‖₂)`` for every row of ``[K, P]`` updates; the clipped rows and the norms.

    The norm is over the whole flat row (every trainable parameter). ``C = inf`` returns the rows
    unchanged (bit for bit); a zero row stays zero.
    """
    norms = torch.linalg.vector_norm(updates, dim=1)
    if not isinstance(clip, Tensor) and math.isinf(float(clip)):
        return updates, norms
    return updates * clip_factors(norms, clip)[:, None], norms
