"""Where per-client state lives: on the device, in host memory, or in a memory-mapped file.

:class:`ClientStateStore` is the :class:`~lfed.state.spec.StateStore` of
:class:`~lfed.lightning.module.FederatedModule` (``engine.client_state``, ``--model.engine.client_state``). It keeps
every per-client tensor whose row has ``"P"`` entries (SCAFFOLD ``c_k``, IGFL previous updates,
EFL Fisher reports, compression residuals, FedDyn ``h_k``: the ones that cost ``N x P`` numbers)
in one of three placements:

``device``
    A dense ``[N, *row]`` buffer on the model's device, as before (fastest while it fits).
``host``
    *Lazy rows* in CPU memory (pinned when the model is on CUDA): a client that never took part
    has no row, and reading it gives the declared initial value. A round gathers its cohort's rows
    to the device (:meth:`~lfed.state.spec.StateStore.rows`) and writes them back after
    (:meth:`~lfed.state.spec.StateStore.write_rows`). Memory grows with the distinct participants, not
    with ``N`` (plus an ``[N]`` int64 index: 8 bytes per client).
``disk``
    Lazy rows in a memory-mapped file (``numpy.memmap``) under ``directory`` (the module's
    ``client_state_dir``, by default ``<default_root_dir>/client_state``), one file per tensor in a
    directory of its own per process, removed by :meth:`ClientStateStore.close`; for populations
    whose state does not fit in RAM. The file is checked before every access: a state file that
    was deleted, replaced or truncated during the run raises :class:`ClientStateFileError` naming it.

Per-client specs without ``"P"`` (AdaFL's scores: one number per client; unless ``rows=True``: FedRoD's personal head) and specs with a
callable ``init`` (AdaFL's ``n_k / n``) stay dense buffers in every placement: they are small,
and a non-constant initial value has no lazy reading.

Every placement computes the same numbers: the rows a round reads and writes are the same
values, in the same dtype (a placement keeps a 0-element tensor per spec as a buffer of the
component, so the precision plugin's ``.double()`` and ``.to(device)`` reach it as they reach a
dense buffer).

Checkpoints are placement-independent: each lazy tensor ``<role>.<name>`` goes into the state
dict as three entries, ``<role>.<name>.clients`` (int64 ``[M]``, ascending), ``.rows``
(``[M, *row]``: the rows of the clients that have one) and ``.shape`` (the logical shape
``[N, *row]``), whatever the placement; so a run checkpointed under one placement resumes under
any other, and a checkpoint grows with the participants, not with ``N``. A ``disk`` store writes
its rows into the checkpoint (a copy, streamed from a scratch memory-mapped file, so the rows
are not held in RAM): the checkpoint file alone resumes the run, and lfed's atomic checkpoint
write (:mod:`lfed.state.atomic`) covers the state with the rest. Loading also accepts the older dense
entry ``<role>.<name>`` of shape ``[N, *row]``.

Under DDP each process keeps a full replica (every rank runs the same client-state updates on
the gathered cohort results; see docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lfed.state.spec import ModuleStateStore, StateSpec, client_range, masked_rows, reading_read_only, state_shape_error, state_shape_errors

__all__ = ["PLACEMENTS", "ClientStateStore", "ClientStateFileError", "dense_rows"]

#: The placements of lazy per-client state.
PLACEMENTS = ("device", "host", "disk")

_NUMPY = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


class ClientStateFileError(RuntimeError):
    """A ``disk`` placement's state file is missing, replaced or of the wrong size."""


def is_lazy(spec: StateSpec) -> bool:
    """Whether ``spec`` is kept as lazy rows (per-client, ``"P"`` in its row or ``rows=True``, a constant init)."""
    return spec.per_client and ("P" in spec.shape or spec.rows) and not callable(spec.init)


def dense_rows(state_dict: dict[str, Any], key: str, init: float = 0.0) -> Tensor:
    """The dense ``[N, *row]`` tensor of the sparse entry ``key`` of a state dict (small runs, tests).

    Rows of clients without one are ``init`` (zeros for every state of docs/algorithms.md).

    Raises:
        KeyError: When ``key`` has no sparse entries (``key.clients``, ``key.rows``, ``key.shape``).
    """
    clients, rows, shape = (state_dict[f"{key}.{s}"] for s in ("clients", "rows", "shape"))
    out = torch.full(tuple(shape.tolist()), float(init), dtype=rows.dtype, device=rows.device)
    out[clients.to(rows.device)] = rows
    return out


class _Rows:
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


class _HostRows(_Rows):
    """Lazy rows in CPU memory (pinned once a gather goes to a CUDA device)."""

    pinned = False

    def gather(self, clients: Tensor) -> Tensor:
        if clients.device.type == "cuda" and not self.pinned and torch.cuda.is_available():
            self.pinned = True
            self.blocks = [b.pin_memory() for b in self.blocks]
        return super().gather(clients)

    def _allocate(self, capacity: int, dtype: torch.dtype) -> Tensor:
        return torch.empty((capacity, *self.row), dtype=dtype, pin_memory=self.pinned)


class _DiskRows(_Rows):
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


class _DeviceRows:
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


class ClientStateStore(ModuleStateStore):
    """The state store with a placement for per-client rows (see the module docstring).

    Args:
        placement: ``device``, ``host`` or ``disk``.
        directory: Where ``disk`` puts its files (a fresh sub-directory per store is made in it);
            may be set later (:attr:`directory`), before the first row is written.
    """

    def __init__(self, placement: str = "device", directory: str | os.PathLike | None = None) -> None:
        super().__init__()
        if placement not in PLACEMENTS:
            raise ValueError(f"client_state: {placement!r} is not one of {', '.join(PLACEMENTS)}")
        self.placement = placement
        self.directory = Path(directory) if directory is not None else None
        self._run_dir: Path | None = None
        self._rows: dict[tuple[int, str], Any] = {}

    # ---------------------------------------------------------------- allocation
    def _disk_dir(self) -> Path:
        if self._run_dir is None:
            if self.directory is None:
                raise ValueError("client_state='disk' needs a directory for its files (client_state_dir)")
            self.directory.mkdir(parents=True, exist_ok=True)
            self._run_dir = Path(tempfile.mkdtemp(prefix=f"state-{os.getpid()}-", dir=self.directory))
            # the files go with the store (or the process), also when a run stops on an error
            self._finalizer = weakref.finalize(self, shutil.rmtree, str(self._run_dir), True)
        return self._run_dir

    def allocate(self, owner: nn.Module, specs: Iterable[StateSpec], num_examples: Tensor, num_params: int, like: Tensor) -> None:
        specs = tuple(specs)
        lazy = [s for s in specs if is_lazy(s)]
        if not getattr(owner, "_lfed_rows_hooks", False):  # before the base store's shape check: one message for all
            owner.register_state_dict_post_hook(lambda module, sd, pre, meta: self._save(module, sd, pre))
            owner.register_load_state_dict_pre_hook(lambda module, sd, pre, meta, strict, missing, *rest: self._load(module, sd, pre, missing))
            owner._lfed_rows_hooks = True
        super().allocate(owner, [s for s in specs if not is_lazy(s)], num_examples, num_params, like)
        prefix = self._owners[id(owner)][0]
        self._owners[id(owner)] = (prefix, owner, specs)
        N = int(num_examples.numel())
        for key in [k for k in self._rows if k[0] == id(owner)]:
            self._rows.pop(key).close()
        for spec in lazy:
            shape = spec.full_shape(N, num_params)
            dtype = spec.dtype or like.dtype
            name = f"{prefix}.{spec.name}"
            if self.placement == "device":
                owner.register_buffer(spec.name, torch.full(shape, float(spec.init), dtype=dtype, device=like.device), persistent=False)
                rows = _DeviceRows(name, owner, spec.name, N, shape[1:], spec.init)
            else:
                sentinel = torch.empty(0, dtype=dtype, device=like.device)
                owner.register_buffer(_like_name(spec.name), sentinel, persistent=False)
                ref = _BufferRef(owner, _like_name(spec.name))
                if self.placement == "host":
                    rows = _HostRows(name, N, shape[1:], spec.init, ref)
                else:
                    rows = _DiskRows(name, N, shape[1:], spec.init, ref, self._disk_dir())
            self._rows[(id(owner), spec.name)] = rows

    def _lazy(self, owner: nn.Module, name: str):
        return self._rows.get((id(owner), name))

    # ---------------------------------------------------------------- access
    def get(self, owner: nn.Module, name: str) -> Tensor:
        rows = self._lazy(owner, name)
        if rows is not None and not isinstance(rows, _DeviceRows):
            raise RuntimeError(
                f"{rows.key}: client_state={self.placement!r} keeps these rows off the device; read a cohort's rows "
                "with rows(name, clients) (the whole [N, ...] tensor exists only with client_state='device')"
            )
        return super().get(owner, name)

    def rows(self, owner: nn.Module, name: str, clients: Tensor) -> Tensor:
        rows = self._lazy(owner, name)
        return super().rows(owner, name, clients) if rows is None else rows.gather(clients)

    def write_rows(self, owner: nn.Module, name: str, clients: Tensor, values: Tensor, mask: Tensor | None = None) -> None:
        rows = self._lazy(owner, name)
        if rows is None:
            return super().write_rows(owner, name, clients, values, mask)
        if isinstance(rows, _DeviceRows):
            return rows.scatter(clients, values, mask)
        if mask is not None:  # host / disk rows: the cohort's rows go to the host anyway (a device read there)
            clients, values = clients[mask], values[mask]
        rows.scatter(clients, values)

    def describe(self) -> dict[str, list[int]]:
        """Logical shapes ``[N, *row]`` of every tensor, whatever the placement."""
        out = {}
        for prefix, owner, specs in self._owners.values():
            for spec in specs:
                rows = self._lazy(owner, spec.name)
                if rows is not None:
                    out[f"{prefix}.{spec.name}"] = [rows.num_clients, *rows.row]
                elif owner._buffers.get(spec.name) is not None:
                    out[f"{prefix}.{spec.name}"] = list(owner._buffers[spec.name].shape)
        return dict(sorted(out.items()))

    def nbytes(self) -> dict[str, int]:
        """Bytes each tensor holds now (lazy rows: rows allocated and the index; ``disk``: its file)."""
        out = {}
        for prefix, owner, specs in self._owners.values():
            for spec in specs:
                rows = self._lazy(owner, spec.name)
                if rows is not None:
                    out[f"{prefix}.{spec.name}"] = rows.nbytes()
                elif owner._buffers.get(spec.name) is not None:
                    b = owner._buffers[spec.name]
                    out[f"{prefix}.{spec.name}"] = b.numel() * b.element_size()
        return out

    def participants(self, owner: nn.Module, name: str) -> Tensor:
        """Ascending ids of the clients with a row of lazy tensor ``name`` (written at least once)."""
        rows = self._lazy(owner, name)
        if rows is None:
            raise KeyError(f"{type(owner).__name__}.{name} is not a lazy per-client tensor")
        return rows.clients()

    def close(self) -> None:
        """Release the rows; ``disk`` removes its files and its directory."""
        for rows in self._rows.values():
            rows.close()
        if self._run_dir is not None:
            self._finalizer()
            self._run_dir = None

    # ---------------------------------------------------------------- the state dict
    def _owner_rows(self, owner: nn.Module):
        return [(name, rows) for (oid, name), rows in self._rows.items() if oid == id(owner)]

    def _save(self, owner: nn.Module, state_dict: dict, prefix: str) -> None:
        for name, rows in self._owner_rows(owner):
            clients, values = rows.export()
            state_dict[f"{prefix}{name}.clients"] = clients
            state_dict[f"{prefix}{name}.rows"] = values
            state_dict[f"{prefix}{name}.shape"] = torch.tensor([rows.num_clients, *rows.row], dtype=torch.long)

    def _load(self, owner: nn.Module, state_dict: dict, prefix: str, missing: list) -> None:
        rows_of = self._owner_rows(owner)
        lazy = {name for name, _ in rows_of}
        specs = self._owners.get(id(owner), ("", None, ()))[2]
        wrong = state_shape_errors(owner, state_dict, prefix, [s.name for s in specs if s.name not in lazy])
        for name, rows in rows_of:  # every shape first, so one error names all that differ
            key, want = f"{prefix}{name}", (rows.num_clients, *rows.row)
            shape = state_dict.get(f"{key}.shape")
            got = tuple(int(v) for v in shape.tolist()) if isinstance(shape, Tensor) else (
                tuple(state_dict[key].shape) if isinstance(state_dict.get(key), Tensor) else want)
            if got != want:
                wrong.append(f"{key} has shape {got} in the checkpoint but {want} in this run")
        if wrong:
            raise state_shape_error(wrong)
        for name, rows in rows_of:
            key = f"{prefix}{name}"
            want = (rows.num_clients, *rows.row)
            parts = {s: state_dict.pop(f"{key}.{s}") for s in ("clients", "rows", "shape") if f"{key}.{s}" in state_dict}
            if parts:
                clients, values = _check_sparse(key, parts, want)
            elif key in state_dict:  # the dense format of lfed before placements
                dense = state_dict.pop(key)
                init = torch.full_like(dense[:1], rows.init)
                differs = (_bits(dense) != _bits(init)).reshape(dense.shape[0], -1).any(1)
                clients = differs.nonzero().squeeze(1)
                values = dense[clients]
            else:
                missing.append(f"{key}.rows")
                continue
            rows.load(clients, values)


def _like_name(name: str) -> str:
    return f"_lfed_like_{name}"


class _BufferRef:
    """The current value of an owner's buffer (it is replaced when the module is cast or moved)."""

    def __init__(self, owner: nn.Module, name: str) -> None:
        self.owner, self.name = owner, name

    @property
    def dtype(self) -> torch.dtype:
        return self.owner._buffers[self.name].dtype


def _bits(t: Tensor) -> Tensor:
    """``t`` as integers of the same width (compares -0.0 and NaN payloads exactly)."""
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    return t.contiguous().view(ints[t.element_size()]) if t.is_floating_point() else t


def _check_sparse(key: str, parts: dict[str, Tensor], want: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Validate the sparse entries of ``key``; return ``(clients, rows)``."""
    lacking = [s for s in ("clients", "rows", "shape") if s not in parts]
    if lacking:
        raise ValueError(f"the checkpoint's state of {key} is incomplete: it has {', '.join(sorted(parts))} "
                         f"but not {', '.join(f'{key}.{s}' for s in lacking)}")
    clients, values = parts["clients"], parts["rows"]
    if clients.dtype != torch.long or clients.dim() != 1:
        raise ValueError(f"{key}.clients: need a 1-D int64 tensor of client ids, got {clients.dtype} of shape {tuple(clients.shape)}")
    if tuple(values.shape) != (clients.numel(), *want[1:]):
        raise ValueError(f"{key}.rows: shape {tuple(values.shape)} does not match {clients.numel()} clients of rows {want[1:]}")
    if clients.numel() and (int(clients.min()) < 0 or int(clients.max()) >= want[0] or clients.unique().numel() != clients.numel()):
        raise ValueError(f"{key}.clients: client ids must be distinct and in [0, {want[0]})")
    return clients, values
