"""Norm bounding (Sun et al., "Can You Really Backdoor Federated Learning?", 2019, §3; docs/robustness.md §2.6)."""

from __future__ import annotations

from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.checks import number
from lfed.robust.rules.base import RobustCombination

__all__ = ["NormBound"]


class NormBound(RobustCombination):
    """``Δ = Σ_k a_k x_k min(1, M / ||x_k||)``: each update clipped to norm ``M``, then combined with the round's aggregation
    weights as :class:`~lfed.server.combination.Mean` combines them (with ``M = ∞`` this is FedAvg's round).

    Args:
        max_norm: The bound ``M > 0``.
    """

    name = "norm_bound"
    takes_f = False
    uses_weights = True
    declares = Declaration(releases=Releases(values=(
        "the weighted mean of the clients' norm-clipped updates (un-noised)",)))

    def __init__(self, max_norm: float = 1.0) -> None:
        super().__init__(None)
        self.max_norm = number("max_norm", max_norm, above=0)

    def hparams(self) -> dict:
        return {"max_norm": self.max_norm}

    def min_inputs(self, f: int) -> int:
        return 1

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, None]:
        scale = (self.max_norm / x.norm(dim=1).clamp_min(1e-30)).clamp(max=1.0)
        return (a * scale) @ x, None
