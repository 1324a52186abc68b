"""The ``disk`` placement of :class:`~lfed.state.stores.ClientStateStore`: lazy rows in a memory-mapped file, checked
before every access (:class:`ClientStateFileError` when it was deleted, replaced or truncated)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lfed.state.lazy_rows import LazyRows

__all__ = ["DiskRows", "ClientStateFileError"]

_NUMPY = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


class ClientStateFileError(RuntimeError):
    """A ``disk`` placement's state file is missing, replaced or of the wrong size."""


class DiskRows(LazyRows):
    """Lazy rows in a memory-mapped file ``<directory>/<key>.rows`` (raw rows in slot order)."""

    def __init__(self, key: str, num_clients: int, row: tuple[int, ...], init: float, like: Tensor, directory: Path) -> None:
        super().__init__(key, num_clients, row, init, like)
        self.path = directory / f"{key}.rows"
        self._inode: int | None = None
        self._map: np.memmap | None = None

    def _numpy_dtype(self, dtype: torch.dtype):
        if dtype not in _NUMPY:
            raise ValueError(f"client_state='disk' keeps rows of dtype float16, float32 or float64, not {dtype} ({self.key}); "
                             "use client_state='host'")
        return _NUMPY[dtype]

    def _expected_bytes(self) -> int:
        return self.capacity * int(np.prod(self.row, dtype=np.int64)) * self.blocks[0].element_size()

    def _check(self) -> None:
        if not self.blocks:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise ClientStateFileError(
                f"client_state='disk': the state file {self.path} of {self.key} is missing (deleted during the run?); "
                "its rows are lost: resume from the last checkpoint"
            ) from None
        if st.st_ino != self._inode or st.st_size != self._expected_bytes():
            raise ClientStateFileError(
                f"client_state='disk': the state file {self.path} of {self.key} was replaced or changed size "
                f"({st.st_size} bytes, expected {self._expected_bytes()}); its rows cannot be trusted: resume from the last checkpoint"
            )

    def _allocate(self, capacity: int, dtype: torch.dtype) -> Tensor:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._map = np.memmap(self.path, dtype=self._numpy_dtype(dtype), mode="w+", shape=(capacity, *self.row))
        self._inode = os.stat(self.path).st_ino
        return torch.from_numpy(self._map)

    def _grow(self, capacity: int) -> None:
        """One block, the file: extended in place (rows already written stay where they are)."""
        if not self.blocks:
            self.starts, self.blocks = [0], [self._allocate(capacity, self.dtype())]
            return
        self._map.flush()
        nbytes = capacity * int(np.prod(self.row, dtype=np.int64)) * self.blocks[0].element_size()
        with open(self.path, "r+b") as f:
            f.truncate(nbytes)
        self._map = np.memmap(self.path, dtype=self._map.dtype, mode="r+", shape=(capacity, *self.row))
        self.blocks = [torch.from_numpy(self._map)]

    def close_storage(self) -> None:
        self._map = None
        super().close_storage()

    def export(self) -> tuple[Tensor, Tensor]:
        """The rows in ascending client order, copied into a scratch memory-mapped file (not RAM)."""
        self._check()
        ids = self.clients()
        if not self.blocks or ids.numel() == 0:
            return ids, torch.zeros((0, *self.row), dtype=self.dtype())
        # a fresh file per export, unlinked once mapped: a state dict taken earlier keeps its own
        # rows (the mapping lives as long as its tensor), and nothing is left behind
        fd, name = tempfile.mkstemp(prefix=f"{self.key}.export-", dir=self.path.parent)
        os.close(fd)
        out = np.memmap(name, dtype=self._map.dtype, mode="w+", shape=(ids.numel(), *self.row))
        with contextlib.suppress(OSError):  # (Windows cannot remove a mapped file: close() does)
            os.unlink(name)
        rows = torch.from_numpy(out)
        slots = self.slot[ids]
        step = max(1, (64 << 20) // max(1, rows[0].numel() * rows.element_size()))  # ~64 MB at a time
        for i in range(0, ids.numel(), step):
            self._read(slots[i : i + step], out=rows[i : i + step])
        return ids, rows

    def nbytes(self) -> int:
        """Bytes of the index in RAM and of the file (its rows are on disk, paged in as needed)."""
        return super().nbytes()

    def close(self) -> None:
        self.close_storage()
        self.path.unlink(missing_ok=True)
