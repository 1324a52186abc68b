"""Inner Product Manipulation (Xie, Koyejo and Gupta, UAI 2020, §4; docs/robustness.md §1.4)."""

from __future__ import annotations

from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.checks import number
from lfed.robust.attacks.base import Attack, honest_rows

__all__ = ["IPM"]


class IPM(Attack):
    """``x_b = -ε μ_H``: the honest updates' mean, reversed and scaled by ``ε``, so that the aggregate's inner product with
    the true update turns negative. Omniscient.

    Args:
        epsilon: ``ε > 0`` (the paper: 0.1 against median-type rules, 100 against Krum).
    """

    name = "ipm"
    omniscient = True
    declares = Declaration(releases=Releases(values=(
        "the IPM attack reads the honest clients' raw updates of the round (an omniscient adversary, outside "
        "the threat model DP-FedAvg's guarantee is stated for)",)))

    def __init__(self, fraction: float = 0.0, per_round: int | None = None, epsilon: float = 0.1) -> None:
        super().__init__(fraction, per_round)
        self.epsilon = number("epsilon", epsilon, above=0)

    def hparams(self) -> dict:
        return {**super().hparams(), "epsilon": self.epsilon}

    def craft(self, updates: Tensor, byzantine: Tensor, honest: Tensor, cohort: Cohort) -> Tensor:
        return -self.epsilon * honest_rows(updates, honest, byzantine).mean(0)
