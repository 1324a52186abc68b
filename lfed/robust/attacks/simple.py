"""Sign flipping, Gaussian and scaling: model poisoning from the Byzantine clients' own updates (docs/robustness.md §1.2)."""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.checks import number
from lfed.rng import round_generator
from lfed.robust.attacks.base import Attack

__all__ = ["Gaussian", "Scaling", "SignFlip"]


class SignFlip(Attack):
    """``x_b ← -x_b``: each Byzantine client sends its own update reversed (Allen-Zhu et al. 2021; Karimireddy et al.
    2021's "bit flipping")."""

    name = "sign_flip"

    def craft(self, updates: Tensor, byzantine: Tensor, honest: Tensor, cohort: Cohort) -> Tensor:
        return -updates.index_select(0, byzantine)


class Scaling(Attack):
    """``x_b ← λ x_b``: each Byzantine client sends its own update scaled by ``λ`` (the boost of model replacement,
    Bagdasaryan et al. 2020, without a backdoor).

    Args:
        scale: ``λ`` (e.g. the cohort size, to replace the model under FedAvg).
    """

    name = "scaling"

    def __init__(self, fraction: float = 0.0, per_round: int | None = None, scale: float = 10.0) -> None:
        super().__init__(fraction, per_round)
        self.scale = number("scale", scale)

    def hparams(self) -> dict:
        return {**super().hparams(), "scale": self.scale}

    def craft(self, updates: Tensor, byzantine: Tensor, honest: Tensor, cohort: Cohort) -> Tensor:
        return self.scale * updates.index_select(0, byzantine)


class Gaussian(Attack):
    """``x_b ~ N(0, σ² I)``, each Byzantine row its own draw, from ``(seed, round, "attack")`` on the updates' device
    (a draw differs between CPU and CUDA; its law does not).

    Args:
        std: ``σ > 0``.
    """

    name = "gaussian"

    def __init__(self, fraction: float = 0.0, per_round: int | None = None, std: float = 200.0) -> None:
        super().__init__(fraction, per_round)
        self.std = number("std", std, above=0)

    def hparams(self) -> dict:
        return {**super().hparams(), "std": self.std}

    def craft(self, updates: Tensor, byzantine: Tensor, honest: Tensor, cohort: Cohort) -> Tensor:
        g = round_generator(cohort.seed, cohort.round, "attack", updates.device)
        shape = (byzantine.numel(), updates.shape[1])
        return self.std * torch.randn(shape, generator=g, device=updates.device, dtype=updates.dtype)
