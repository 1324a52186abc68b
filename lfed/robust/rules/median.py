"""Coordinate-wise median and trimmed mean (Yin et al., ICML 2018, Definitions 1 and 2; docs/robustness.md §2.1)."""

from __future__ import annotations

from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.robust.rules.base import RobustCombination

__all__ = ["CoordinateMedian", "TrimmedMean"]


class CoordinateMedian(RobustCombination):
    """``Δ_i = med_k x_{k,i}`` for every coordinate ``i`` over the ``k`` counting updates; with ``k`` even the mean of the
    two middle values. The aggregation weights are not used. Bounded by the honest coordinates when ``f < k/2``.

    Args:
        f: Byzantine updates tolerated (only checked: ``K > 2f``); None: the attack's.
    """

    name = "median"
    declares = Declaration(releases=Releases(values=(
        "the coordinate-wise median of the clients' raw updates (unclipped, un-noised; its sensitivity is not "
        "the mean's)",)))

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, None]:
        ordered = x.sort(dim=0).values
        k = ordered.shape[0]
        return (ordered[(k - 1) // 2] + ordered[k // 2]) / 2, None


class TrimmedMean(RobustCombination):
    """``Δ_i = 1/(k - 2f) Σ_{j=f+1}^{k-f} x_{(j),i}``: per coordinate, the mean after dropping the ``f`` largest and the
    ``f`` smallest values (Yin et al.'s ``β = f / k``). The aggregation weights are not used.

    Args:
        f: Values dropped at each end of every coordinate (``K > 2f``); None: the attack's.
    """

    name = "trimmed_mean"
    declares = Declaration(releases=Releases(values=(
        "the coordinate-wise trimmed mean of the clients' raw updates (unclipped, un-noised)",)))

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, None]:
        ordered = x.sort(dim=0).values
        return ordered[f:ordered.shape[0] - f].mean(0), None
