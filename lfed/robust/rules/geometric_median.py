"""The geometric median by the smoothed Weiszfeld algorithm: RFA (Pillutla et al., IEEE TSP 2022, Algorithm 2;
docs/robustness.md §2.4)."""

from __future__ import annotations

from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.checks import integer, number
from lfed.robust.rules.base import RobustCombination

__all__ = ["GeometricMedian"]


class GeometricMedian(RobustCombination):
    """``Δ ≈ argmin_z Σ_k α_k max(ν, ||z - x_k||)`` by ``iterations`` smoothed Weiszfeld steps from the weighted mean
    ``z⁰ = Σ α_k x_k``: ``β_k = α_k / max(ν, ||z - x_k||)``, ``z ← Σ β_k x_k / Σ β_k``. ``α_k`` are the round's
    aggregation weights (size-weighted, as RFA), renormalised over the counting clients.

    Args:
        iterations: Weiszfeld steps ``R`` (RFA's experiments: 3).
        nu: Smoothing ``ν > 0`` (RFA: 1e-6).
    """

    name = "geometric_median"
    takes_f = False
    uses_weights = True
    declares = Declaration(releases=Releases(values=(
        "the weighted geometric median of the clients' raw updates (unclipped, un-noised)",)))

    def __init__(self, iterations: int = 3, nu: float = 1e-6) -> None:
        super().__init__(None)
        self.iterations = integer("iterations", iterations, at_least=1)
        self.nu = number("nu", nu, above=0)

    def hparams(self) -> dict:
        return {"iterations": self.iterations, "nu": self.nu}

    def min_inputs(self, f: int) -> int:
        return 1

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, None]:
        alpha = a / a.sum()
        z = alpha @ x
        for _ in range(self.iterations):
            beta = alpha / (x - z).norm(dim=1).clamp_min(self.nu)
            z = (beta @ x) / beta.sum()
        return z, None
