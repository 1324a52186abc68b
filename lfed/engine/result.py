"""What local training of a cohort returns (:class:`CohortResult`), whichever backend ran it."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class CohortResult:
    """What local training of a cohort returns.

    Attributes:
        weights: ``[K, P]`` final client weights ``w_k_end``.
        loss: ``[K]`` mean training loss over the steps each client took (0 for none).
        buffers: ``{name: [K, ...]}`` final client buffers (a net with running statistics,
            either backend), else None.
    """

    weights: Tensor
    loss: Tensor
    buffers: dict[str, Tensor] | None = None
