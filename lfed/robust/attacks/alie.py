"""A Little Is Enough (Baruch, Baruch and Goldberg, NeurIPS 2019, §3; docs/robustness.md §1.3)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.checks import number
from lfed.robust.attacks.base import Attack, honest_moments

__all__ = ["ALIE", "alie_z"]


def alie_z(n: int, m: int) -> float:
    """Baruch et al.'s ``z_max``: ``s = ⌊n/2 + 1⌋ - m`` supporters needed, ``z = Φ⁻¹((n - s) / n)`` (``n`` updates,
    ``m`` of them Byzantine). With ``s ≤ 0`` (a Byzantine majority) the formula has no finite value: we take ``s = 1``."""
    s = max(math.floor(n / 2 + 1) - m, 1)
    return float(torch.special.ndtri(torch.tensor((n - s) / n, dtype=torch.float64)))


class ALIE(Attack):
    """``x_b = μ_H - z σ_H``: the honest updates' coordinate-wise mean minus ``z`` of their standard deviations
    (``n - 1`` denominator), ``z`` from :func:`alie_z` with the round's counting updates ``n`` and Byzantine ones ``m``.
    Omniscient: it reads the honest rows of the round (with none, the Byzantine clients' own honest updates).

    Args:
        z: A fixed ``z`` instead of the paper's ``z_max`` (None).
    """

    name = "alie"
    omniscient = True
    declares = Declaration(releases=Releases(values=(
        "the ALIE attack reads the honest clients' raw updates of the round (an omniscient adversary, outside "
        "the threat model DP-FedAvg's guarantee is stated for)",)))

    def __init__(self, fraction: float = 0.0, per_round: int | None = None, z: float | None = None) -> None:
        super().__init__(fraction, per_round)
        self.z = None if z is None else number("z", z)

    def hparams(self) -> dict:
        return {**super().hparams(), **({"z": self.z} if self.z is not None else {})}

    def craft(self, updates: Tensor, byzantine: Tensor, honest: Tensor, cohort: Cohort) -> Tensor:
        n, m = byzantine.numel() + honest.numel(), byzantine.numel()
        z = self.z if self.z is not None else alie_z(n, m)
        mu, sigma = honest_moments(updates, honest, byzantine)
        return mu - z * sigma
