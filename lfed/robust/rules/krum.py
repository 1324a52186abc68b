"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017, §4; docs/robustness.md §2.2)."""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.checks import integer
from lfed.robust.rules.base import RobustCombination, krum_scores, pairwise_sq_distances

__all__ = ["Krum", "MultiKrum"]


class Krum(RobustCombination):
    """``Δ = x_{i*}``, ``i* = argmin_i s(i)``, ``s(i) = Σ_{i→j} ||x_i - x_j||²`` over the ``k - f - 2`` rows nearest
    to ``x_i`` (itself excluded). Needs ``K > 2f + 2``. Ties go to the lower row of the cohort. Costs the ``k × k``
    distances: ``O(k² P)``. The aggregation weights are not used.

    Args:
        f: Byzantine updates tolerated; None: the attack's.
    """

    name = "krum"
    releases = ("one client's raw update, chosen by its distances to the others' (unclipped, un-noised)",)

    def min_inputs(self, f: int) -> int:
        return 2 * f + 3

    def requirement(self) -> str:
        return "K > 2f + 2"

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, Tensor]:
        k = x.shape[0]
        scores = krum_scores(pairwise_sq_distances(x), k - f - 2)
        best = torch.argmin(scores)  # the first of equal minima
        kept = torch.zeros(k, dtype=torch.bool, device=x.device).index_fill_(0, best.view(1), True)
        return x.index_select(0, best.view(1))[0], kept


class MultiKrum(Krum):
    """``Δ = (1/m) Σ_{i ∈ M} x_i``: the mean of the ``m`` rows of lowest Krum score (ties: the lower row first).

    Args:
        f: Byzantine updates tolerated (``K > 2f + 2``); None: the attack's.
        m: Rows averaged; None: ``k - f`` (the honest ones, as ByzFL); ``m = 1`` is Krum.
    """

    name = "multi_krum"
    releases = ("the mean of the clients' raw updates that their distances to the others' select (unclipped, un-noised)",)

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
        scores = krum_scores(pairwise_sq_distances(x), k - f - 2)
        chosen = torch.sort(scores, stable=True).indices[:m]
        kept = torch.zeros(k, dtype=torch.bool, device=x.device).index_fill_(0, chosen, True)
        return x.index_select(0, chosen).mean(0), kept
