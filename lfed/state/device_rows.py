"""The ``device`` placement of :class:`~lfed.state.stores.ClientStateStore`: a dense buffer of the owner, and which
clients were written."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lfed.state.spec import client_range, masked_rows, reading_read_only

__all__ = ["DeviceRows"]


class DeviceRows:
    """The ``device`` placement: a dense buffer of the owner, and which clients were written."""

    def __init__(self, key: str, owner: nn.Module, name: str, num_clients: int, row: tuple[int, ...], init: float) -> None:
        self.key, self.owner, self.name, self.num_clients, self.row, self.init = key, owner, name, num_clients, row, float(init)
        self.written = torch.zeros(num_clients, dtype=torch.bool)

    @property
    def buf(self) -> Tensor:
        return self.owner._buffers[self.name]

    def gather(self, clients: Tensor) -> Tensor:
        span = client_range(clients) if reading_read_only() else None
        return self.buf[clients] if span is None else self.buf[span[0] : span[1]]  # a view under read_only_rows()

    def _written(self) -> Tensor:
        """Which clients were written, kept beside the buffer (marking them reads nothing back to the host)."""
        if self.written.device != self.buf.device:
            self.written = self.written.to(self.buf.device)
        return self.written

    def scatter(self, clients: Tensor, values: Tensor, mask: Tensor | None = None) -> None:
        """Write ``values`` to the rows of ``clients``; with ``mask`` only the selected ones (``torch.where``, not a
        boolean index: no device read)."""
        buf, written = self.buf, self._written()
        clients = clients.to(buf.device)
        buf[clients] = masked_rows(buf, clients, values, mask)
        if mask is None:
            written.index_fill_(0, clients, True)  # (``written[clients] = True`` copies a host True to the device: a sync)
        else:
            written[clients] = written[clients] | mask.to(buf.device)

    def clients(self) -> Tensor:
        return self.written.nonzero().squeeze(1).cpu()

    def export(self) -> tuple[Tensor, Tensor]:
        ids = self.clients()
        return ids, self.buf[ids.to(self.buf.device)]

    def load(self, clients: Tensor, rows: Tensor) -> None:
        buf = self.buf
        buf.fill_(self.init)
        self.written.fill_(False)
        self.scatter(clients.to(buf.device), rows.to(buf.device))

    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size() + self.written.numel()

    def close(self) -> None:
        pass
