"""Label flipping: data poisoning that trains through the engine (Biggio et al. 2012; Fang et al. 2020's "label
flipping"; docs/robustness.md §1.1)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.robust.attacks.base import Attack

__all__ = ["LabelFlip"]


class LabelFlip(Attack):
    """The Byzantine clients train honestly on labels ``y ← C - 1 - y`` (``C`` classes) and send what they trained. Their
    set is fixed (``fraction``); the poisoned labels are made once per run and reused every round."""

    name = "label_flip"
    poisons_data = True

    def __init__(self, fraction: float = 0.0, per_round: int | None = None) -> None:
        super().__init__(fraction, per_round)
        self._poisoned: tuple[int, int, Tensor] | None = None  # (id of the clean labels, seed, poisoned labels)

    def check_start(self, data: Any) -> None:
        data.require_labels("attack='label_flip' (flipped class labels)")

    def training_data(self, cohort: Cohort, data: Any, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if not self.active:
            return x, y
        if self._poisoned is None or self._poisoned[:2] != (id(y), cohort.seed):
            byz = self.byzantine_clients(cohort.num_clients, cohort.seed).to(y.device)
            index, sizes = data.client_index[byz], data.client_sizes[byz]
            positions = index[torch.arange(index.shape[1], device=y.device)[None, :] < sizes[:, None]]
            poisoned = y.clone()
            poisoned[positions] = data.num_classes - 1 - y[positions]
            self._poisoned = (id(y), cohort.seed, poisoned)
        return x, self._poisoned[2]
