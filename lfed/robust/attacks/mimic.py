"""Mimic (Karimireddy, He and Jaggi, ICLR 2022, §6 "mimic attack"; docs/robustness.md §1.6)."""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.robust.attacks.base import Attack

__all__ = ["Mimic"]


class Mimic(Attack):
    """Every Byzantine client sends a copy of one honest client's update, ``x_b = x_{i*}``, the one farthest along the
    honest updates' top principal direction ``z``: ``i* = argmax_i |⟨z, x_i - μ_H⟩|`` (ties: the lower row). The paper
    estimates ``z`` over the first rounds and then keeps ``i*``; we, omniscient, take each round's ``z`` (``i*`` is the
    largest entry of the top eigenvector of the centered Gram matrix ``(X_H - μ_H)(X_H - μ_H)ᵀ``: ``[h, h]``, no ``[P, P]``).
    It over-represents one client's data, which defeats rules that assume i.i.d. honest updates."""

    name = "mimic"
    omniscient = True
    releases = ("the Mimic attack reads the honest clients' raw updates of the round (an omniscient adversary, outside "
                "the threat model DP-FedAvg's guarantee is stated for)",)

    def craft(self, updates: Tensor, byzantine: Tensor, honest: Tensor, cohort: Cohort) -> Tensor:
        if honest.numel() == 0:
            return updates.index_select(0, byzantine)
        h = updates.index_select(0, honest)
        centered = h - h.mean(0)
        gram = (centered @ centered.T).to(torch.float64)
        top = torch.linalg.eigh(gram).eigenvectors[:, -1]
        return h.index_select(0, torch.argmax(top.abs()).view(1))[0]
