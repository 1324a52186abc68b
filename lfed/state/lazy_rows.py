"""Lazy per-client rows, the storage the ``host`` and ``disk`` placements of :class:`~lfed.state.stores.ClientStateStore`
share: a slot per client that has a row, the rows in blocks (:class:`LazyRows`), and which specs are kept that way
(:func:`is_lazy`). The placements themselves: :mod:`~lfed.state.host_rows`, :mod:`~lfed.state.disk_rows`,
:mod:`~lfed.state.device_rows`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lfed.state.spec import StateSpec, client_range, reading_read_only

__all__ = ["LazyRows", "BufferRef", "is_lazy", "like_name"]


def is_lazy(spec: StateSpec) -> bool:
    """Whether ``spec`` is kept as lazy rows (per-client, ``"P"`` in its row or ``rows=True``, a constant init)."""
    return spec.per_client and ("P" in spec.shape or spec.rows) and not callable(spec.init)

class LazyRows:
    """Lazy rows of one per-client tensor: a slot per client that has a row, rows in slot order.

    The rows live in *blocks*: block ``i`` holds slots ``starts[i] .. starts[i] + len(blocks[i])``.
    ``host`` grows by adding a block as large as all before it (capacity doubles, rows already
    written are never copied or moved); ``disk`` keeps one block, its file, and extends it in place.
    """

    def __init__(self, key: str, num_clients: int, row: tuple[int, ...], init: float, like: Tensor) -> None:
        self.key, self.num_clients, self.row, self.init = key, num_clients, row, float(init)
        self.like = like  # the 0-element buffer whose dtype (and device) the rows follow
        self.slot = torch.full((num_clients,), -1, dtype=torch.long)
        self.count = 0
        self.blocks: list[Tensor] = []  # [rows_i, *row] on the CPU
        self.starts: list[int] = []

    # -- storage, specialised by placement
    @property
    def capacity(self) -> int:
        return self.starts[-1] + int(self.blocks[-1].shape[0]) if self.blocks else 0

    def _allocate(self, capacity: int, dtype: torch.dtype) -> Tensor:
        raise NotImplementedError

    def _grow(self, capacity: int) -> None:
        """Make room for ``capacity`` rows in all (default: a new block for the rows past the last)."""
        self.starts.append(self.capacity)
        self.blocks.append(self._allocate(capacity - self.starts[-1], self.dtype()))

    def _check(self) -> None:
        """Verify the backing storage before an access (the disk file is still there)."""

    def close(self) -> None:
        self.close_storage()

    # -- the rows
    def dtype(self) -> torch.dtype:
        return self.like.dtype

    def _stored_dtype(self) -> torch.dtype | None:
        return self.blocks[0].dtype if self.blocks else None

    def _ensure(self, needed: int) -> None:
        dtype = self.dtype()
        if self.blocks and self._stored_dtype() != dtype:  # the module was cast (precision plugin)
            old = self._read(torch.arange(self.count))
            self.close_storage()
            self._grow(max(needed, self.count, 1))
            self._write(torch.arange(self.count), old.to(dtype))
        if needed <= self.capacity:
            return
        self._grow(max(needed, 2 * self.capacity, 16))

    def close_storage(self) -> None:
        self.blocks, self.starts = [], []

    def _parts(self, slots: Tensor):
        """``(block, positions in slots, slots within the block)`` for each block ``slots`` touch."""
        if len(self.blocks) == 1:
            yield self.blocks[0], None, slots
            return
        which = torch.bucketize(slots, torch.tensor(self.starts[1:]), right=True)
        for i, block in enumerate(self.blocks):
            pos = (which == i).nonzero().squeeze(1)
            if pos.numel():
                yield block, pos, slots[pos] - self.starts[i]

    def _read(self, slots: Tensor, out: Tensor | None = None) -> Tensor:
        """Rows at ``slots`` (all ``< count``), in one pass over each block."""
        if out is None:
            out = torch.empty((slots.numel(), *self.row), dtype=self._stored_dtype())
        for block, pos, local in self._parts(slots):
            if pos is None:
                torch.index_select(block, 0, local, out=out)
            else:
                out[pos] = block.index_select(0, local)
        return out

    def _write(self, slots: Tensor, values: Tensor) -> None:
        if getattr(self, "_view_done", None) is not None:  # a copy to the device may still read a block in place
            self._view_done.synchronize()
            self._view_done = None
        for block, pos, local in self._parts(slots):
            block[local] = values if pos is None else values[pos]

    def gather(self, clients: Tensor) -> Tensor:
        """``[K, *row]`` rows of ``clients`` (a copy on the clients' device)."""
        self._check()
        device = clients.device
        ids = clients.detach().to("cpu", torch.long)
        pin = device.type == "cuda"
        idx = self.slot[ids]
        have = idx >= 0
        staged = False
        if not self.blocks or not bool(have.any()):
            out = torch.full((ids.numel(), *self.row), self.init, dtype=self.dtype(), pin_memory=pin)
        else:
            if self._stored_dtype() != self.dtype():
                self._ensure(self.count)
            staged = reading_read_only()
            view = self._view(idx) if staged and bool(have.all()) else None
            if view is not None:  # the rows as stored, in place: no gather (pinned host blocks: an async copy)
                moved = view.to(device, non_blocking=pin)
                if pin:
                    self._view_done = torch.cuda.Event()
                    self._view_done.record()
                return moved
            out = self._staging(ids.numel(), pin) if staged else \
                torch.empty((ids.numel(), *self.row), dtype=self._stored_dtype(), pin_memory=pin)
            self._read(idx.clamp(min=0), out=out)  # one pass over the rows
            if not bool(have.all()):
                out[~have] = self.init
        moved = out.to(device, non_blocking=pin)
        if pin and staged:  # its staging buffer is rewritten only once this copy is done
            self._stage_done[self._stage_turn] = torch.cuda.Event()
            self._stage_done[self._stage_turn].record()
        return moved

    def _view(self, slots: Tensor) -> Tensor | None:
        """The stored rows at ``slots`` as a view when they are consecutive slots of one block (a read of every
        client in order), else None."""
        span = client_range(slots)
        if span is None:
            return None
        for start, block in zip(self.starts, self.blocks):
            if start <= span[0] and span[1] <= start + block.shape[0]:
                return block[span[0] - start : span[1] - start]
        return None

    def _staging(self, k: int, pin: bool) -> Tensor:
        """The reused buffer of a :func:`~lfed.state.spec.read_only_rows` read. On the CPU one buffer, and the rows
        returned ARE it (valid until the next read). On CUDA two pinned buffers taken in turn: the host gathers
        the next chunk into one while the device copies (and scores) the other; a buffer is rewritten only
        after its copy to the device finished (an event). Grown when a read needs more rows."""
        if "_stage" not in self.__dict__:
            self._stage, self._stage_done, self._stage_pinned, self._stage_turn = [None, None], [None, None], pin, 1
        turn = 1 - self._stage_turn if pin else 0
        self._stage_turn = turn
        buf = self._stage[turn]
        if buf is None or buf.shape[0] < k or buf.dtype != self._stored_dtype() or self._stage_pinned != pin:
            self._stage_pinned = pin
            buf = self._stage[turn] = torch.empty((max(k, 0), *self.row), dtype=self._stored_dtype(), pin_memory=pin)
        elif self._stage_done[turn] is not None:
            self._stage_done[turn].synchronize()
        return buf[:k]

    def scatter(self, clients: Tensor, values: Tensor) -> None:
        """Write ``values [K, *row]`` to the rows of ``clients`` (new clients get a row)."""
        self._check()
        ids = clients.detach().to("cpu", torch.long)
        if ids.numel() == 0:
            return
        new = ids[self.slot[ids] < 0].unique()
        if self.count + new.numel() > self.capacity or self._stored_dtype() != self.dtype():
            self._ensure(self.count + new.numel())
        self.slot[new] = torch.arange(self.count, self.count + new.numel())
        self.count += new.numel()
        slots = self.slot[ids]
        self._write(slots, values.detach().to("cpu", self._stored_dtype()))

    def clients(self) -> Tensor:
        """Ascending ids of the clients that have a row."""
        return (self.slot >= 0).nonzero().squeeze(1)

    def export(self) -> tuple[Tensor, Tensor]:
        """``(clients [M] ascending, rows [M, *row])`` for the state dict."""
        self._check()
        ids = self.clients()
        if not self.blocks or ids.numel() == 0:
            return ids, torch.zeros((0, *self.row), dtype=self.dtype())
        return ids, self._read(self.slot[ids])

    def load(self, clients: Tensor, rows: Tensor) -> None:
        """Replace every row by ``rows`` of ``clients`` (all other clients read ``init``)."""
        self.slot.fill_(-1)
        self.count = 0
        if self.blocks:
            self._check()
        self.scatter(clients, rows)

    def nbytes(self) -> int:
        """Bytes held: the rows allocated and the ``[N]`` index."""
        return self.slot.numel() * self.slot.element_size() + sum(b.numel() * b.element_size() for b in self.blocks)

def like_name(name: str) -> str:
    return f"_lfed_like_{name}"


class BufferRef:
    """The current value of an owner's buffer (it is replaced when the module is cast or moved)."""

    def __init__(self, owner: nn.Module, name: str) -> None:
        self.owner, self.name = owner, name

    @property
    def dtype(self) -> torch.dtype:
        return self.owner._buffers[self.name].dtype
