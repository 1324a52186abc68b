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

The placements' rows are their own modules: :mod:`~lfed.state.lazy_rows` (the rows ``host`` and ``disk`` share),
:mod:`~lfed.state.host_rows`, :mod:`~lfed.state.disk_rows`, :mod:`~lfed.state.device_rows`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lfed.state.device_rows import DeviceRows
from lfed.state.disk_rows import ClientStateFileError, DiskRows
from lfed.state.host_rows import HostRows
from lfed.state.lazy_rows import BufferRef, is_lazy, like_name
from lfed.state.spec import ModuleStateStore, StateSpec, state_shape_error, state_shape_errors

__all__ = ["PLACEMENTS", "ClientStateStore", "ClientStateFileError", "dense_rows"]

#: The placements of lazy per-client state.
PLACEMENTS = ("device", "host", "disk")


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
                rows = DeviceRows(name, owner, spec.name, N, shape[1:], spec.init)
            else:
                sentinel = torch.empty(0, dtype=dtype, device=like.device)
                owner.register_buffer(like_name(spec.name), sentinel, persistent=False)
                ref = BufferRef(owner, like_name(spec.name))
                if self.placement == "host":
                    rows = HostRows(name, N, shape[1:], spec.init, ref)
                else:
                    rows = DiskRows(name, N, shape[1:], spec.init, ref, self._disk_dir())
            self._rows[(id(owner), spec.name)] = rows

    def _lazy(self, owner: nn.Module, name: str):
        return self._rows.get((id(owner), name))

    # ---------------------------------------------------------------- access
    def get(self, owner: nn.Module, name: str) -> Tensor:
        rows = self._lazy(owner, name)
        if rows is not None and not isinstance(rows, DeviceRows):
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
        if isinstance(rows, DeviceRows):
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
