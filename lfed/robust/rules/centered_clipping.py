"""Centered clipping (Karimireddy, He and Jaggi, ICML 2021, eq. (CC); docs/robustness.md §2.5)."""

from __future__ import annotations

from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.checks import integer, number
from lfed.robust.rules.base import RobustCombination
from lfed.state.spec import StateSpec

__all__ = ["CenteredClipping"]


class CenteredClipping(RobustCombination):
    """``v ← v + (1/k) Σ_i (x_i - v) min(1, τ / ||x_i - v||)``, ``iterations`` times, from the last round's aggregate
    ``v`` (its server state: the momentum of the paper's center; 0 before the first round). ``Δ = v``. The aggregation
    weights are not used (the paper's mean is uniform).

    Args:
        tau: Clipping radius ``τ > 0``.
        iterations: Clipping steps ``L`` (the paper: 1 with momentum).
    """

    name = "centered_clipping"
    takes_f = False
    declares = Declaration(releases=Releases(values=(
        "the centered-clipped mean of the clients' raw updates (each clipped around the last aggregate, "
        "un-noised)",)))

    def __init__(self, tau: float = 1.0, iterations: int = 1) -> None:
        super().__init__(None)
        self.tau = number("tau", tau, above=0)
        self.iterations = integer("iterations", iterations, at_least=1)

    def hparams(self) -> dict:
        return {"tau": self.tau, "iterations": self.iterations}

    def min_inputs(self, f: int) -> int:
        return 1

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("center", per_client=False)]

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, None]:
        v = self.state("center").to(x.dtype)
        for _ in range(self.iterations):
            diff = x - v
            scale = (self.tau / diff.norm(dim=1).clamp_min(1e-30)).clamp(max=1.0)
            v = v + (scale[:, None] * diff).mean(0)
        self.set_state("center", v)
        return v, None
