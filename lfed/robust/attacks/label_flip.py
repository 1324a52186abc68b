"""Label flipping: data poisoning that trains through the engine (Biggio et al. 2012; Fang et al. 2020's "label
flipping"; docs/robustness.md §1.1)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.robust.attacks.base import Attack, shared_copy

__all__ = ["LabelFlip", "client_positions"]


class LabelFlip(Attack):
    """The Byzantine clients train honestly on labels ``y ← C - 1 - y`` (``C`` classes) and send what they trained. Their
    set is fixed (``fraction``); the poisoned labels are made once and reused every round, and by every run of the
    process with the same labels, seed and set (so a grid's label-flipping runs train in one engine call)."""

    name = "label_flip"
    poisons_data = True

    def __init__(self, fraction: float = 0.0, per_round: int | None = None) -> None:
        super().__init__(fraction, per_round)
        self._mine: tuple[Any, int, Tensor] | None = None  # (weak reference to the clean labels, seed, poisoned labels)

    def check_start(self, data: Any) -> None:
        data.require_labels("attack='label_flip' (flipped class labels)")

    def training_data(self, cohort: Cohort, data: Any, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if not self.active:
            return x, y
        if self._mine is not None and self._mine[0]() is y and self._mine[1] == cohort.seed:
            return x, self._mine[2]

        def make() -> Tensor:
            byz = self.byzantine_clients(cohort.num_clients, cohort.seed).to(y.device)
            positions = client_positions(data, byz)
            poisoned = y.clone()
            poisoned[positions] = data.num_classes - 1 - y[positions]
            return poisoned

        poisoned = shared_copy(("label_flip", cohort.seed, cohort.num_clients, self.fraction), y, data.client_index, make)
        self._mine = (weakref.ref(y), cohort.seed, poisoned)
        return x, poisoned


def client_positions(data: Any, clients: Tensor) -> Tensor:
    """The positions in the training tensors of the examples of the clients ``clients`` (``[N]`` bool) hold."""
    index, sizes = data.client_index[clients], data.client_sizes[clients]
    return index[torch.arange(index.shape[1], device=index.device)[None, :] < sizes[:, None]]
