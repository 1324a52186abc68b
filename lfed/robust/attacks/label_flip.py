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

    #: (ids of the clean labels and of the partition, seed, N, fraction) -> (weak references to both, the poisoned labels)
    _made: dict[tuple, tuple[Any, Tensor]] = {}

    def check_start(self, data: Any) -> None:
        data.require_labels("attack='label_flip' (flipped class labels)")

    def training_data(self, cohort: Cohort, data: Any, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if not self.active:
            return x, y
        key = (id(y), id(data.client_index), cohort.seed, cohort.num_clients, self.fraction)
        made = LabelFlip._made.get(key)
        if made is None or made[0]() is not y or made[1]() is not data.client_index:  # a reused id is no match
            byz = self.byzantine_clients(cohort.num_clients, cohort.seed).to(y.device)
            index, sizes = data.client_index[byz], data.client_sizes[byz]
            positions = index[torch.arange(index.shape[1], device=y.device)[None, :] < sizes[:, None]]
            poisoned = y.clone()
            poisoned[positions] = data.num_classes - 1 - y[positions]
            LabelFlip._made = {k: v for k, v in LabelFlip._made.items() if v[0]() is not None and v[1]() is not None}
            made = LabelFlip._made[key] = (weakref.ref(y), weakref.ref(data.client_index), poisoned)
        return x, made[2]
