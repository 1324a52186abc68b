"""Nearest-neighbour mixing (Allouah et al., AISTATS 2023, Algorithm 1; docs/robustness.md §2.7)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.robust.rules.base import pairwise_sq_distances
from lfed.robust.rules.preaggregation import PreAggregator

__all__ = ["NearestNeighborMixing"]


class NearestNeighborMixing(PreAggregator):
    """``y_i = 1/(k - f) Σ_{j ∈ N_i} x_j``, ``N_i`` the ``k - f`` counting updates nearest to ``x_i`` (itself included;
    ties: the lower row first); ``Δ = rule(y_1, ..., y_k)`` with the rows' own weights. Needs ``K > 2f`` and the rule's.

    Args:
        rule: The rule fed the mixed rows (a name or a ``RobustCombination``).
        f: Byzantine updates tolerated (None: the attack's).
    """

    name = "nnm"

    def __init__(self, rule: Any = "median", f: int | None = None) -> None:
        super().__init__(rule, f)

    def min_inputs(self, f: int) -> int:
        return max(2 * f + 1, self.rule.min_inputs(f))

    def requirement(self) -> str:
        return f"K > 2f and {self.rule.name}'s {self.rule.requirement()}"

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, Tensor | None]:
        k = x.shape[0]
        d = pairwise_sq_distances(x)
        nearest = torch.sort(d, dim=1, stable=True).indices[:, :k - f]  # [k, k - f]: row i among them (distance 0)
        mixing = x.new_zeros(k, k).scatter_(1, nearest, 1.0 / (k - f))  # y = M x: no [k, k - f, P] gather
        y = mixing @ x
        return self.rule.aggregate(y, a, f, cohort)
