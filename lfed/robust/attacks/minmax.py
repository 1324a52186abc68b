"""Min-max and min-sum (Shejwalkar and Houmansadr, NDSS 2021, §V-B eqs. (6) and (7); docs/robustness.md §1.5)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.checks import one_of
from lfed.robust.attacks.base import Attack, honest_moments
from lfed.robust.rules.base import pairwise_sq_distances

__all__ = ["MinMax", "MinSum", "PERTURBATIONS"]

PERTURBATIONS = ("std", "unit_vec", "sign")


class MinMax(Attack):
    """``x_b = μ_H + γ p`` with the largest ``γ ≥ 0`` such that ``max_i ||x_b - x_i|| ≤ max_{i,j} ||x_i - x_j||`` over
    the honest rows ``i, j``: the Byzantine update is no farther from any honest one than two honest ones are from each
    other. ``p``: ``-σ_H`` (``std``), ``-μ_H/||μ_H||`` (``unit_vec``) or ``-sign(μ_H)`` (``sign``). The paper finds ``γ``
    by a halving search; each constraint is a quadratic in ``γ``, so we solve it exactly:
    ``γ = min_i (-b_i + √(b_i² + q (R² - c_i))) / q`` with ``c_i = ||μ - x_i||²``, ``b_i = ⟨μ - x_i, p⟩``,
    ``q = ||p||²``, ``R² = max_{i,j} ||x_i - x_j||²`` (``γ = 0`` when ``p = 0``). Omniscient.

    Args:
        perturbation: ``std`` (the paper's strongest in most of its tables), ``unit_vec`` or ``sign``.
    """

    name = "min_max"
    omniscient = True
    declares = Declaration(releases=Releases(values=(
        "the min-max attack reads the honest clients' raw updates of the round (an omniscient adversary, outside "
        "the threat model DP-FedAvg's guarantee is stated for)",)))

    def __init__(self, fraction: float = 0.0, per_round: int | None = None,
                 perturbation: Literal[PERTURBATIONS] = "std") -> None:  # type: ignore[valid-type]
        super().__init__(fraction, per_round)
        self.perturbation = one_of("perturbation", perturbation, PERTURBATIONS)

    def hparams(self) -> dict:
        return {**super().hparams(), "perturbation": self.perturbation}

    def direction(self, mu: Tensor, sigma: Tensor) -> Tensor:
        """The perturbation ``p``."""
        if self.perturbation == "std":
            return -sigma
        if self.perturbation == "sign":
            return -torch.sign(mu)
        return -mu / mu.norm().clamp_min(1e-30)

    def gamma(self, h: Tensor, mu: Tensor, p: Tensor) -> Tensor:
        """The largest ``γ`` the constraint allows (0-dim, on the device)."""
        q = (p * p).sum()
        diff = mu[None, :] - h
        c, b = (diff * diff).sum(1), diff @ p
        r2 = pairwise_sq_distances(h).max()
        roots = (-b + (b * b + q * (r2 - c).clamp_min(0)).sqrt()) / q.clamp_min(1e-300)
        return torch.where(q > 0, roots.min(), torch.zeros_like(q))

    def craft(self, updates: Tensor, byzantine: Tensor, honest: Tensor, cohort: Cohort) -> Tensor:
        rows = honest if honest.numel() else byzantine
        h = updates.index_select(0, rows)
        mu, sigma = honest_moments(updates, honest, byzantine)
        p = self.direction(mu, sigma)
        return mu + self.gamma(h, mu, p) * p


class MinSum(MinMax):
    """``x_b = μ_H + γ p`` with the largest ``γ`` such that ``Σ_i ||x_b - x_i||² ≤ max_i Σ_j ||x_i - x_j||²``: the sum of
    squared distances to the honest updates is no larger than an honest update's. As ``Σ_i ⟨μ_H - x_i, p⟩ = 0``, exactly
    ``γ = √((S - Σ_i c_i) / (h q))`` (``S`` the right-hand side, ``h`` honest rows). Omniscient."""

    name = "min_sum"
    declares = Declaration(releases=Releases(values=(
        "the min-sum attack reads the honest clients' raw updates of the round (an omniscient adversary, outside "
        "the threat model DP-FedAvg's guarantee is stated for)",)))

    def gamma(self, h: Tensor, mu: Tensor, p: Tensor) -> Tensor:
        q = (p * p).sum()
        diff = mu[None, :] - h
        c = (diff * diff).sum()
        s = pairwise_sq_distances(h).sum(1).max()
        root = ((s - c).clamp_min(0) / (h.shape[0] * q).clamp_min(1e-300)).sqrt()
        return torch.where(q > 0, root, torch.zeros_like(q))
