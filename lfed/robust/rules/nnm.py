"""Nearest-neighbour mixing (Allouah et al., AISTATS 2023, Algorithm 1; docs/robustness.md §2.7)."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from lfed.base.component import Cohort
from lfed.robust.rules.base import select_lowest, sq_distances
from lfed.robust.rules.preaggregation import PreAggregator

__all__ = ["NearestNeighborMixing"]


class NearestNeighborMixing(PreAggregator):
    """``y_i = 1/(k - f) Σ_{j ∈ N_i} x_j``, ``N_i`` the ``k - f`` counting updates nearest to ``x_i`` (itself always
    among them; ties: the lower row first, distances within their rounding bounds tying, as Krum's scores do:
    :func:`~lfed.robust.rules.base.select_lowest`); ``Δ = rule(y_1, ..., y_k)`` with the rows' own weights. Needs
    ``K > 2f`` and the rule's.

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
        d, e = sq_distances(x)
        d = d.fill_diagonal_(-math.inf)  # row i is always its own neighbour
        nearest = select_lowest(d, e, k - f)  # [k, k] bool, k - f per row
        mixing = nearest.to(x.dtype) / (k - f)  # y = M x: no [k, k - f, P] gather
        y = mixing @ x
        return self.rule.aggregate(y, a, f, cohort)
