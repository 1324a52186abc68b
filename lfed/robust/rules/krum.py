"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017, §4; docs/robustness.md §2.2)."""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.checks import integer
from lfed.robust.rules.base import RobustCombination, first_true, krum_bounds, krum_scores, select_lowest, sq_distances

__all__ = ["Krum", "MultiKrum"]


class Krum(RobustCombination):
    """``Δ = x_{i*}``, ``i* = argmin_i s(i)``, ``s(i) = Σ_{i→j} ||x_i - x_j||²`` over the ``k - f - 2`` rows nearest
    to ``x_i`` (itself excluded). Needs ``K > 2f + 2``. Ties go to the lower row of the cohort: the distances are computed
    in float64 from the Gram matrix with a bound on their rounding (:func:`~lfed.robust.rules.base.sq_distances`), and
    scores closer than their bounds count as tied (:func:`~lfed.robust.rules.base.select_lowest`), so equal scores in
    exact arithmetic always go to the lower row. Costs the ``k × k`` distances: ``O(k² P)``. The aggregation weights are
    not used.

    Args:
        f: Byzantine updates tolerated; None: the attack's.
    """

    name = "krum"
    declares = Declaration(releases=Releases(values=(
        "one client's raw update, chosen by its distances to the others' (unclipped, un-noised)",)))

    def min_inputs(self, f: int) -> int:
        return 2 * f + 3

    def requirement(self) -> str:
        return "K > 2f + 2"

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, Tensor]:
        kept = self.lowest(x, f, 1)
        return x.index_select(0, first_true(kept).view(1))[0], kept

    @staticmethod
    def lowest(x: Tensor, f: int, m: int) -> Tensor:
        """``[k]`` bool: the ``m`` rows of lowest Krum score, ties (scores within their rounding bounds) to the lower
        rows."""
        k = x.shape[0]
        d, e = sq_distances(x)
        return select_lowest(krum_scores(d, k - f - 2), krum_bounds(d, e, k - f - 2), m)


class MultiKrum(Krum):
    """``Δ = (1/m) Σ_{i ∈ M} x_i``: the mean of the ``m`` rows of lowest Krum score (ties, as Krum's: the lower row first).

    Args:
        f: Byzantine updates tolerated (``K > 2f + 2``); None: the attack's.
        m: Rows averaged; None: ``k - f`` (the honest ones, as ByzFL); ``m = 1`` is Krum.
    """

    name = "multi_krum"
    declares = Declaration(releases=Releases(values=(
        "the mean of the clients' raw updates that their distances to the others' select (unclipped, un-noised)",)))

    def __init__(self, f: int | None = None, m: int | None = None) -> None:
        super().__init__(f)
        if m is not None:
            integer("m", m, at_least=1, detail=" or None (k - f)")
        self.m = m

    def hparams(self) -> dict:
        return {**super().hparams(), **({"m": self.m} if self.m is not None else {})}

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, Tensor]:
        k = x.shape[0]
        m = min(self.m, k) if self.m is not None else k - f
        kept = self.lowest(x, f, m)
        chosen = torch.sort(kept.to(torch.uint8), descending=True, stable=True).indices[:m]  # the kept rows, in order
        return x.index_select(0, chosen).mean(0), kept
