"""Declared state of a round's components, and the one store that holds it.

A component (client rule, aggregation weights, server combination, channel, sampler; see
:mod:`lfed.base.component`) declares the tensors it keeps with :class:`StateSpec`: per-client
tensors ``[N, *shape]`` (one row per client) and server tensors ``[*shape]``, each with its
initial value. ``shape`` may use ``"P"`` for the number of trainable parameters. The component
never allocates, saves or checks them itself; :class:`StateStore` does, for every component:

* :meth:`StateStore.allocate` makes the tensors (on the device and dtype of the model, unless
  a spec names its own dtype),
* :meth:`StateStore.rows` gathers a cohort's rows, :meth:`StateStore.write_rows` writes back
  only the rows of the clients a mask selects (an inactive client keeps its state, docs/algorithms.md §2),
* a load-state-dict hook refuses a checkpoint whose state has other shapes, naming the tensor
  and both shapes,
* :meth:`StateStore.describe` lists every tensor with its shape for the run fingerprint
  (:func:`lfed.state.fingerprint.run_fingerprint`), so no name is written out anywhere else.

:class:`ModuleStateStore` keeps each tensor as a buffer of the component that declared it, so it
sits in the Lightning module's ``state_dict`` (``objective.control``, ...) and in every
checkpoint. Components reach their state only through the store's methods, so another store
replaces it without touching a component: :class:`lfed.state.stores.ClientStateStore` (the store
of :class:`~lfed.lightning.module.FederatedModule`) keeps per-client rows of ``P`` numbers lazily on the
device, in host memory or in a memory-mapped file, as sparse ``{clients, rows, shape}`` entries
of the state dict (docs/state.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

#: ``StateSpec(init=GLOBAL)``: a client's row starts as the round's global model at its first participation.
GLOBAL = "global"

__all__ = ["GLOBAL", "StateSpec", "StateStore", "ModuleStateStore", "check_state_shapes", "client_range", "read_only_rows",
           "reading_read_only", "state_shape_errors", "state_shape_error"]

_READ_ONLY: ContextVar[bool] = ContextVar("lfed_read_only_rows", default=False)


@contextlib.contextmanager
def read_only_rows() -> Iterator[None]:
    """Inside, :meth:`StateStore.rows` may answer without a copy: rows read here are READ-ONLY and valid until
    the next read of the same tensor.

    For a reader that takes rows chunk after chunk and keeps nothing (the personalized evaluation of
    every client, :func:`lfed.evaluation.scores.personal_scores`): a dense store returns a view of its buffer
    for a contiguous range of clients (``clients`` on the CPU), a host or disk store a view of its block
    for rows in consecutive slots (copied to the device from pinned memory without blocking, on CUDA) and
    otherwise gathers into one reused buffer (two pinned ones taken in turn, on CUDA), and a row that starts as
    the global model (``init="global"``) is returned as read when every client of the range has
    started. Outside (every round), rows are copies, as always.
    """
    token = _READ_ONLY.set(True)
    try:
        yield
    finally:
        _READ_ONLY.reset(token)


def reading_read_only() -> bool:
    """Whether the caller is inside :func:`read_only_rows`."""
    return _READ_ONLY.get()


def masked_rows(buf: Tensor, clients: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """The rows to write to ``buf[clients]``: ``values`` (moved to the buffer's device and dtype: a host-made flag
    joins its buffer), and where ``mask`` is False the rows as they are (``torch.where``, not a boolean index: no
    device read)."""
    values = values.to(device=buf.device, dtype=buf.dtype)
    if mask is None:
        return values
    keep = mask.to(buf.device).reshape(-1, *([1] * (values.dim() - 1)))
    return torch.where(keep, values, buf[clients])


def client_range(clients: Tensor) -> tuple[int, int] | None:
    """``(lo, hi)`` when ``clients`` are ``lo, lo + 1, ..., hi - 1`` on the CPU, else None (also for device
    tensors: reading them would stall the device, and a device gather is cheap there)."""
    if clients.device.type != "cpu" or clients.dim() != 1 or clients.numel() == 0:
        return None
    lo, n = int(clients[0]), clients.numel()
    if int(clients[-1]) - lo + 1 != n or (n > 1 and not bool((clients[1:] - clients[:-1] == 1).all())):
        return None
    return lo, lo + n


@dataclass(frozen=True)
class StateSpec:
    """One tensor a component keeps between rounds.

    Attributes:
        name: Buffer name, unique within the component (``"client_control"``).
        shape: Shape of one client's row (per-client) or of the server tensor; ``"P"`` stands for
            the number of trainable parameters. ``("P",)`` is a flat vector like the model.
        per_client: Whether there is one row per client (``[N, *shape]``).
        init: Initial value: a number for a constant, a callable ``(num_examples [N]) -> Tensor``
            of the full shape (AdaFL's ``n_k / n``), or ``"global"`` (:data:`GLOBAL`): a client's
            row is the round's global model until it is first written (a personal model, MOON's
            previous model; read with ``Component.rows(name, clients, first=w)``).
        dtype: A fixed dtype (e.g. ``torch.float64`` for scores), or None for the model's dtype.
        rows: Keep a per-client tensor without ``"P"`` in its row as rows in the run's ``client_state`` placement
            (device, host or disk; only clients with a row are saved) like a ``"P"`` row: a model-sized part
            (FedRoD's personal head, ``P_h`` numbers). False: a dense buffer in every placement (small state).
    """

    name: str
    shape: tuple[int | str, ...] = ("P",)
    per_client: bool = True
    init: float | str | Callable[[Tensor], Tensor] = 0.0
    dtype: torch.dtype | None = None
    rows: bool = False

    def full_shape(self, num_clients: int, num_params: int) -> tuple[int, ...]:
        """The allocated shape for ``num_clients`` clients and ``num_params`` parameters."""
        row = tuple(num_params if s == "P" else int(s) for s in self.shape)
        return (num_clients, *row) if self.per_client else row


def check_state_shapes(owner: nn.Module, state_dict: Mapping[str, Any], prefix: str, names: Iterable[str] | None = None) -> None:
    """Refuse a state dict whose buffers of ``owner`` have other shapes than ``owner``'s own.

    Per-client state is ``[N, ...]`` and server state ``[...]``: a checkpoint made for another
    number of clients or another model cannot be resumed (copying it would fail deep inside
    ``load_state_dict`` or, worse, index the wrong clients).

    Raises:
        ValueError: Naming the buffer, the checkpoint's shape and this run's shape.
    """
    wrong = state_shape_errors(owner, state_dict, prefix, names)
    if wrong:
        raise state_shape_error(wrong)


def state_shape_errors(owner: nn.Module, state_dict: Mapping[str, Any], prefix: str, names: Iterable[str] | None = None) -> list[str]:
    """``"<key> has shape ... in the checkpoint but ... in this run"`` for each buffer that differs."""
    wrong = []
    for name in names if names is not None else list(owner._buffers):
        buf = owner._buffers.get(name)
        key = prefix + name
        if buf is None or key not in state_dict or not isinstance(state_dict[key], Tensor):
            continue
        got, want = tuple(state_dict[key].shape), tuple(buf.shape)
        if got != want:
            wrong.append(f"{key} has shape {got} in the checkpoint but {want} in this run")
    return wrong


def state_shape_error(wrong: list[str]) -> ValueError:
    """The error for the shape differences ``wrong`` (of :func:`state_shape_errors`)."""
    return ValueError(
        "the checkpoint's state does not fit this run: " + "; ".join(wrong) + ". Per-client state is "
        "[num_clients, ...] and server state [num_params]: resume with the same data.num_clients "
        "and the same model (and algorithm) as the run that saved it."
    )


class StateStore:
    """Interface of the store of every component's declared state (see the module docstring)."""

    def allocate(self, owner: nn.Module, specs: Iterable[StateSpec], num_examples: Tensor, num_params: int, like: Tensor) -> None:
        """Make ``owner``'s tensors for ``N = len(num_examples)`` clients, ``num_params`` parameters."""
        raise NotImplementedError

    def get(self, owner: nn.Module, name: str) -> Tensor:
        """The whole tensor (a server tensor, or all rows of a per-client one)."""
        raise NotImplementedError

    def set(self, owner: nn.Module, name: str, value: Tensor) -> None:
        """Replace a server tensor's value by a new tensor (same shape, dtype and device as declared).

        Not in place: a tensor read with :meth:`get` before keeps the value it had (a component that reads its
        state, then writes it, then uses what it read, computes with the old value, as the maths reads: adaptive
        clipping's ``C_t`` after ``C_{t+1}`` is stored, issue 49)."""
        raise NotImplementedError

    def rows(self, owner: nn.Module, name: str, clients: Tensor) -> Tensor:
        """``[K, ...]`` rows of ``clients`` of a per-client tensor (a copy)."""
        raise NotImplementedError

    def write_rows(self, owner: nn.Module, name: str, clients: Tensor, values: Tensor, mask: Tensor | None = None) -> None:
        """Write ``values [K, ...]`` to the rows of ``clients``; with ``mask [K]`` only where it is True."""
        raise NotImplementedError

    def describe(self) -> dict[str, list[int]]:
        """``{"<owner>.<name>": shape}`` of every tensor allocated, for the run fingerprint."""
        raise NotImplementedError


class ModuleStateStore(StateStore):
    """Keeps each declared tensor as a buffer of the component that declared it (on the device).

    :meth:`register_owner` names a component by its role in the Lightning module (``objective``),
    the prefix of its tensors in :meth:`describe` and in the state dict.
    """

    def __init__(self) -> None:
        self._owners: dict[int, tuple[str, nn.Module, tuple[StateSpec, ...]]] = {}

    def register_owner(self, prefix: str, owner: nn.Module) -> None:
        """Name ``owner`` (its attribute name in the module) for :meth:`describe`."""
        entry = self._owners.get(id(owner))
        self._owners[id(owner)] = (prefix, owner, entry[2] if entry else ())

    def allocate(self, owner: nn.Module, specs: Iterable[StateSpec], num_examples: Tensor, num_params: int, like: Tensor) -> None:
        specs = tuple(specs)
        N = int(num_examples.numel())
        for spec in specs:
            shape = spec.full_shape(N, num_params)
            dtype = spec.dtype or like.dtype
            if callable(spec.init):
                value = spec.init(num_examples).to(device=like.device, dtype=dtype)
                if tuple(value.shape) != shape:
                    raise ValueError(f"{type(owner).__name__}.{spec.name}: init gave shape {tuple(value.shape)}, declared {shape}")
            else:
                value = torch.full(shape, float(spec.init), dtype=dtype, device=like.device)
            owner.register_buffer(spec.name, value)
        prefix = self._owners.get(id(owner), (type(owner).__name__, None, ()))[0]
        self._owners[id(owner)] = (prefix, owner, specs)
        if not getattr(owner, "_lfed_shape_hook", False):
            names = lambda: [s.name for s in self._owners.get(id(owner), ("", None, ()))[2]]  # noqa: E731
            owner._register_load_state_dict_pre_hook(
                lambda state_dict, prefix, *args: check_state_shapes(owner, state_dict, prefix, names())
            )
            owner._lfed_shape_hook = True

    def get(self, owner: nn.Module, name: str) -> Tensor:
        return owner._buffers[name]

    def set(self, owner: nn.Module, name: str, value: Tensor) -> None:
        old = owner._buffers[name]
        new = torch.empty_like(old)
        new.copy_(value)  # broadcast and cast as before; the tensor read before keeps its value (StateStore.set)
        owner._buffers[name] = new

    def rows(self, owner: nn.Module, name: str, clients: Tensor) -> Tensor:
        buf = owner._buffers[name]
        span = client_range(clients) if reading_read_only() else None
        return buf[clients] if span is None else buf[span[0] : span[1]]  # a view under read_only_rows()

    def write_rows(self, owner: nn.Module, name: str, clients: Tensor, values: Tensor, mask: Tensor | None = None) -> None:
        buf = owner._buffers[name]
        buf[clients] = masked_rows(buf, clients, values, mask)

    def describe(self) -> dict[str, list[int]]:
        out = {}
        for prefix, owner, specs in self._owners.values():
            for spec in specs:
                buf = owner._buffers.get(spec.name)
                if buf is not None:
                    out[f"{prefix}.{spec.name}"] = list(buf.shape)
        return dict(sorted(out.items()))
