"""Label flipping: data poisoning that trains through the engine (Biggio et al. 2012; Fang et al. 2020's "label
flipping"; docs/robustness.md §1.1)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.robust.attacks.base import Attack

__all__ = ["LabelFlip", "client_positions"]


class LabelFlip(Attack):
    """The Byzantine clients train honestly on labels ``y ← C - 1 - y`` (``C`` classes) and send what they trained. Their
    set is fixed (``fraction``); the poisoned labels are made once and reused every round, and by every run of the
    process with the same labels, seed and set (so a grid's label-flipping runs train in one engine call)."""

    name = "label_flip"
    poisons_data = True

    def check(self, context) -> list[str]:
        if context.data is not None:
            context.data.require_labels("attack='label_flip' (flipped class labels)")
        return super().check(context)

    def training_data(self, cohort: Cohort, data: Any, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if not self.active:
            return x, y

        def make() -> Tensor:
            positions = client_positions(data, self.byzantine_clients(cohort.num_clients, cohort.seed).to(y.device))
            poisoned = y.clone()
            poisoned[positions] = data.num_classes - 1 - y[positions]
            return poisoned

        return x, self.poisoned_copy(cohort, data, y, (), make)


def client_positions(data: Any, clients: Tensor) -> Tensor:
    """The positions in the training tensors of the examples of the clients ``clients`` (``[N]`` bool) hold."""
    index, sizes = data.client_index[clients], data.client_sizes[clients]
    return index[torch.arange(index.shape[1], device=index.device)[None, :] < sizes[:, None]]
