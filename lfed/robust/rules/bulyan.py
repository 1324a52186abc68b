"""Bulyan over Krum (El Mhamdi et al., ICML 2018, §4; docs/robustness.md §2.3)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.robust.rules.base import RobustCombination, krum_bounds, krum_scores, select_lowest, sq_distances

__all__ = ["Bulyan"]


class Bulyan(RobustCombination):
    """Select ``θ = k - 2f`` rows by Krum applied recursively (each pick leaves the set, the next Krum runs on the rest
    with ``|R| - f - 2`` neighbours), then per coordinate average the ``β = θ - 2f`` selected values closest to their
    median. Needs ``K ≥ 4f + 3``. Ties: the lower row first, in both steps: each Krum pick as :class:`Krum`'s (scores
    within their rounding bounds tie), and per coordinate the selected rows in row order, not in the order Krum picked
    them (``|x - med|`` is a correctly rounded subtraction from the one computed median, so equal distances tie
    exactly). The aggregation weights are not used.

    Args:
        f: Byzantine updates tolerated; None: the attack's.
    """

    name = "bulyan"
    declares = Declaration(releases=Releases(values=(
        "a coordinate-wise mean of the clients' raw updates selected by Krum and closeness to the median "
        "(unclipped, un-noised)",)))

    def min_inputs(self, f: int) -> int:
        return 4 * f + 3

    def requirement(self) -> str:
        return "K ≥ 4f + 3"

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, Tensor]:
        k = x.shape[0]
        d, e = sq_distances(x)
        theta, beta = k - 2 * f, k - 4 * f
        gone = torch.zeros(k, dtype=torch.bool, device=x.device)  # picked rows leave the set (as +inf distances)
        for i in range(theta):  # Krum on the remaining k - i rows, one pick at a time (no device read)
            sub = d.masked_fill(gone[None, :] | gone[:, None], math.inf).fill_diagonal_(0)
            neighbours = max(k - i - f - 2, 0)
            scores = krum_scores(sub, neighbours).masked_fill(gone, math.inf)
            bounds = krum_bounds(sub, e, neighbours).masked_fill(gone, 0)
            gone = gone | select_lowest(scores, bounds, 1)
        chosen = torch.sort(gone.to(torch.uint8), descending=True, stable=True).indices[:theta]  # in row order
        s = x.index_select(0, chosen)  # [θ, P], the lower row first
        ordered = s.sort(dim=0).values
        med = (ordered[(theta - 1) // 2] + ordered[theta // 2]) / 2
        closest = torch.sort((s - med).abs(), dim=0, stable=True).indices[:beta]  # [β, P]: ties to the lower row
        return s.gather(0, closest).mean(0), gone
