"""The server amplification of a round: how far it moved the model against FedAvg's step (``round/amplification``).

:func:`server_amplification` is ``||Δ|| / ||Σ_k a_k (-lr Σ_t g_k,t)||``, read off the clients' updates
(:func:`gradient_displacement`); the round (:func:`lfed.core.round.finish_round`) logs it through its sharing
(:meth:`lfed.personal.sharing.ShareAll.amplification`; not defined under partial sharing).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # evaluation is below the component contract (docs/architecture.md): the type only
    from lfed.base.component import Cohort

__all__ = ["gradient_displacement", "server_amplification"]


def gradient_displacement(updates: Tensor, rule, lr: float, steps_done: Tensor) -> Tensor | None:
    """``[K, P]`` the part of each client's update its gradients made: ``-lr Σ_t g_t``.

    A client stepping ``w ← w - lr (γ g + s)`` with a constant shift ``s`` for ``T`` steps moves
    ``Δ_k = -lr γ Σ_t g_t - lr T s``, so ``-lr Σ_t g_t = (Δ_k + lr T s) / γ``. None where this
    cannot be read off the update: a rule with a decay (FedProx, EFL) or a loss term.
    """
    if rule.decay is not None or rule.loss_term is not None or rule.grad_mask is not None:
        return None
    out = updates
    if rule.shift is not None:
        out = out + lr * steps_done.to(updates.dtype)[:, None] * rule.shift
    scale = rule.grad_scale
    if isinstance(scale, Tensor):
        return out / (scale[:, None] if scale.dim() == 1 else scale)
    return out / scale if scale != 1.0 else out


def server_amplification(delta: Tensor, updates: Tensor, rule, lr: float, cohort: Cohort, weights: Tensor) -> Tensor | None:
    """``||Δ|| / ||Σ_k a_k (-lr Σ_t g_k,t)||``: how far the round moved the model against FedAvg's step.

    ``a_k`` are the round's normalised aggregation weights and the denominator is the weighted
    mean of the clients' gradient displacements (:func:`gradient_displacement`), FedAvg's update
    had the clients taken the same gradient steps. 1 for FedAvg; IGFL-C's corrections (a heavy-ball
    momentum in delta form, RESULTS.md) make it larger. None where it cannot be read off the
    updates (:func:`gradient_displacement`); otherwise a 0-dim tensor on the device, NaN where the
    denominator is zero or not finite (no device read here: :func:`verify_round` drops a NaN).
    """
    grads = gradient_displacement(updates, rule, lr, cohort.steps_done)
    if grads is None:
        return None
    a = weights.to(grads.dtype)
    reference = (a / a.sum()) @ grads
    denominator = torch.linalg.vector_norm(reference)
    ratio = torch.linalg.vector_norm(delta) / denominator
    defined = (denominator != 0) & torch.isfinite(denominator)
    return torch.where(defined, ratio, torch.full_like(ratio, math.nan))
