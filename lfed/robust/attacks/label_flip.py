"""Label flipping: data poisoning that trains through the engine (Biggio et al. 2012; Fang et al. 2020's "label
flipping"; docs/robustness.md §1.1)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.robust.attacks.base import Attack

__all__ = ["LabelFlip"]


class LabelFlip(Attack):
    """The Byzantine clients train honestly on labels ``y ← C - 1 - y`` (``C`` classes) and send what they trained. Their
    set is fixed (``fraction``); the poisoned labels are made once and reused every round, and by every run of the
    process with the same labels, seed and set (so a grid's label-flipping runs train in one engine call)."""

    name = "label_flip"
    poisons_data = True

    #: (id of the clean labels, seed, N, fraction) -> [(weak reference to the labels, the partition, poisoned labels)]
    _made: dict[tuple, list[tuple[Any, Tensor, Tensor]]] = {}

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
        key = (id(y), cohort.seed, cohort.num_clients, self.fraction)
        LabelFlip._made = {k: [e for e in v if e[0]() is not None] for k, v in LabelFlip._made.items()}  # drop the collected
        same = [e for e in LabelFlip._made.get(key, []) if e[0]() is y and torch.equal(e[1], data.client_index)]
        if same:  # another run of this process with the same labels, partition, seed and set: its copy
            poisoned = same[0][2]
        else:
            byz = self.byzantine_clients(cohort.num_clients, cohort.seed).to(y.device)
            index, sizes = data.client_index[byz], data.client_sizes[byz]
            positions = index[torch.arange(index.shape[1], device=y.device)[None, :] < sizes[:, None]]
            poisoned = y.clone()
            poisoned[positions] = data.num_classes - 1 - y[positions]
            LabelFlip._made.setdefault(key, []).append((weakref.ref(y), data.client_index, poisoned))
        self._mine = (weakref.ref(y), cohort.seed, poisoned)
        return x, poisoned
