"""The ``host`` placement of :class:`~lfed.state.stores.ClientStateStore`: lazy rows in CPU memory."""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.state.lazy_rows import LazyRows

__all__ = ["HostRows"]


class HostRows(LazyRows):
    """Lazy rows in CPU memory (pinned once a gather goes to a CUDA device)."""

    pinned = False

    def gather(self, clients: Tensor) -> Tensor:
        if clients.device.type == "cuda" and not self.pinned and torch.cuda.is_available():
            self.pinned = True
            self.blocks = [b.pin_memory() for b in self.blocks]
        return super().gather(clients)

    def _allocate(self, capacity: int, dtype: torch.dtype) -> Tensor:
        return torch.empty((capacity, *self.row), dtype=dtype, pin_memory=self.pinned)
