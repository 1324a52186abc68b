"""Mimic (Karimireddy, He and Jaggi, ICLR 2022, §6 "mimic attack"; docs/robustness.md §1.6)."""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.base.declaration import Declaration, Releases
from lfed.robust.attacks.base import Attack

__all__ = ["Mimic"]

#: Entries of the top eigenvector's magnitude within this share of the largest tie (the lower row wins).
TIE = 1e-9


class Mimic(Attack):
    """Every Byzantine client sends a copy of one honest client's update, ``x_b = x_{i*}``, the one farthest along the
    honest updates' top principal direction ``z``, on either side: ``i* = argmax_i |⟨z, x_i - μ_H⟩|`` (the paper writes
    ``argmax_i ⟨z, x_i - μ_H⟩``; the sign of an eigenvector is arbitrary, so lfed takes the absolute value, and the pick
    does not depend on the sign the eigensolver returns). The paper estimates ``z`` over the first rounds and then keeps
    ``i*``; we, omniscient, take each round's ``z`` (``⟨z, x_i - μ_H⟩ = σ_1 v_i`` with ``v`` the top eigenvector of the
    centered Gram matrix ``(X_H - μ_H)(X_H - μ_H)ᵀ``, in float64: ``[h, h]``, no ``[P, P]``). Ties: the lower row, where
    entries of ``|v|`` within a relative ``1e-9`` of the largest tie (the eigenvector is computed only to rounding).
    It over-represents one client's data, which defeats rules that assume i.i.d. honest updates."""

    name = "mimic"
    omniscient = True
    declares = Declaration(releases=Releases(values=(
        "the Mimic attack reads the honest clients' raw updates of the round (an omniscient adversary, outside "
        "the threat model DP-FedAvg's guarantee is stated for)",)))

    def craft(self, updates: Tensor, byzantine: Tensor, honest: Tensor, cohort: Cohort) -> Tensor:
        if honest.numel() == 0:
            return updates.index_select(0, byzantine)
        h = updates.index_select(0, honest)
        h64 = h.to(torch.float64)
        centered = h64 - h64.mean(0)
        reach = torch.linalg.eigh(centered @ centered.T).eigenvectors[:, -1].abs()  # |⟨z, x_i - μ_H⟩| / σ_1
        tied = reach >= (1 - TIE) * reach.max()  # within the eigenvector's rounding of the largest
        return h.index_select(0, torch.argmax(tied.to(torch.uint8)).view(1))[0]
