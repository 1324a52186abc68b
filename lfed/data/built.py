"""The federated data as built (:class:`FederatedData`): the pooled tensors, each client's positions in them, its held-out
and validation splits, label counts, host copies and digests. :class:`lfed.data.federated.FederatedDataset` builds it;
the round and the engine read it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

__all__ = ["FederatedData", "HOST_FIELDS"]


#: Each split: its padded index's name, its flat positions' name, its sizes' name.
_NAMES = {"train": ("client_index", "client_flat", "client_sizes"), "test": ("holdout_index", "holdout_flat", "holdout_sizes"),
          "val": ("client_val_index", "client_val_flat", "client_val_sizes")}


def _positions(split: str, kind: str, doc: str) -> property:
    """A split's positions as an attribute: read through :meth:`FederatedData.padded` or :meth:`FederatedData.flat`
    (the clients' validation split: None when there is none), set as given in that form."""

    def read(self: FederatedData) -> Tensor | None:
        if split not in self._given:  # only the validation split may be absent
            return None
        return self.padded(split) if kind == "padded" else self.flat(split)

    return property(read, lambda self, value: self._set(split, kind, value), doc=doc)


def _pack(flat: Tensor, sizes: Tensor, width: int, starts: Tensor) -> Tensor:
    """``[N, width]`` the flat positions padded with 0 (client ``k``'s in row ``k``)."""
    column = torch.arange(width, device=sizes.device)[None, :]
    valid = column < sizes[:, None]
    if flat.numel() == 0:
        return torch.zeros(sizes.numel(), width, dtype=torch.long, device=sizes.device)
    at = torch.where(valid, starts[:, None] + column, torch.zeros((), dtype=torch.long, device=sizes.device))
    return torch.where(valid, flat[at], torch.zeros((), dtype=flat.dtype, device=sizes.device))


HOST_FIELDS = ("client_sizes", "holdout_sizes", "client_val_sizes", "label_counts")
"""The per-client fields of :class:`FederatedData` with a host copy (:meth:`FederatedData.host`)."""


class FederatedData:
    """Everything about the clients' data that a federated round needs.

    Not to be changed once built: a checkpoint's fingerprint hashes the labels and the clients' indices once
    (:meth:`digests`; a tensor replaced or written in place by torch is hashed again).

    Attributes:
        train_x, train_y: Pooled training examples of all clients.
        test_x, test_y: Global test set.
        client_index: ``[N, max_n]`` positions of each client's training examples, padded (built on first use and
            kept: ``N x`` the largest client, for small populations and old code; a round never builds it, it
            gathers its cohort's rows from the flat positions, :meth:`gather`).
        client_flat: The clients' training positions concatenated in client order (CSR with ``client_sizes``): what is
            stored, 8 bytes an example whatever the sizes' spread.
        client_sizes: ``[N]`` number of training examples ``n_k``.
        holdout_index: ``[N, max_h]`` positions of each client's held-out examples, padded as ``client_index`` (``[N, 1]``
            zeros without a held-out split); ``holdout_flat`` the same concatenated.
        holdout_sizes: ``[N]`` (zeros when there is no held-out split).
        label_counts: ``[N, C]`` training label counts per client (DWFed, plots); ``[N, 0]``
            for regression.
        num_classes: ``C``; None for regression (floating targets).
        val_index: ``[v]`` positions in the pooled training set of the server's validation
            examples (no client holds them); None or empty when there is no validation split.
        client_val_index: ``[N, max_v]`` positions of each client's own validation examples, padded as ``client_index``
            (``client_validation_fraction``; no client trains on them); None when there are none; ``client_val_flat``
            the same concatenated.
        client_val_sizes: ``[N]`` their numbers; None when there are none.
        notes: Who the evaluation splits belong to, where not to the server alone: ``test_from_clients`` (the
            test examples are the training clients' own, LEAF's per-writer held-out data), ``val_from_clients``
            (the server's validation split was carved from those clients' examples). Under DP their metrics
            are client data (docs/privacy.md "Server-held means server-held").
        augment: The :class:`lfed.data.augment.Augmentation` of every local step's batch (None: none).
    """

    #: A pooled population (every example in memory); :class:`lfed.data.lazy.LazyFederatedData` is the other kind.
    lazy: ClassVar[bool] = False
    #: The tensors :meth:`to` moves, with the clients' positions as given (what is made from them is made again).
    _TENSORS = ("train_x", "train_y", "test_x", "test_y", "client_sizes", "holdout_sizes", "label_counts", "val_index",
                "client_val_sizes")

    def __init__(self, train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, client_index: Tensor | None,
                 client_sizes: Tensor, holdout_index: Tensor | None, holdout_sizes: Tensor, label_counts: Tensor,
                 num_classes: int | None, val_index: Tensor | None = None, client_val_index: Tensor | None = None,
                 client_val_sizes: Tensor | None = None, notes: frozenset = frozenset(), augment: Any = None, *,
                 client_flat: Tensor | None = None, holdout_flat: Tensor | None = None,
                 client_val_flat: Tensor | None = None) -> None:
        """Each split's positions given flat (``client_flat``, ``holdout_flat``, ``client_val_flat``: what
        :class:`~lfed.data.federated.FederatedDataset` builds) or padded (``client_index``, ...; flattened here).
        ``holdout_flat`` None with ``holdout_index`` None: no held-out split."""
        self.train_x, self.train_y, self.test_x, self.test_y = train_x, train_y, test_x, test_y
        self.client_sizes, self.holdout_sizes, self.label_counts = client_sizes, holdout_sizes, label_counts
        self.num_classes, self.val_index, self.client_val_sizes = num_classes, val_index, client_val_sizes
        self.notes, self.augment = notes, augment
        # each split's positions, as given: ("flat", tensor) or ("padded", tensor); the other form is made when read
        self._given: dict[str, tuple[str, Tensor | None]] = {}
        for split, padded, flat, sizes in (("train", client_index, client_flat, client_sizes),
                                           ("test", holdout_index, holdout_flat, holdout_sizes),
                                           ("val", client_val_index, client_val_flat, client_val_sizes)):
            if padded is not None and flat is not None:
                raise ValueError(f"{_NAMES[split][0]}: give the positions padded or flat, not both")
            if padded is None and flat is None and split == "train":
                raise ValueError("client_index: the clients' positions are required (padded [N, max] or client_flat)")
            if split == "val" and sizes is None:
                continue
            if padded is None and flat is None:  # no held-out split: [N, 1] zeros, as lfed has always padded it
                padded = torch.zeros(sizes.numel(), 1, dtype=torch.long, device=sizes.device)
            self._given[split] = ("padded", padded) if padded is not None else ("flat", flat)
        self._made: dict[tuple, Tensor] = {}

    def __repr__(self) -> str:
        return (f"FederatedData(num_clients={self.num_clients}, train_examples={self.train_y.shape[0]}, "
                f"test_examples={self.test_y.shape[0]}, num_classes={self.num_classes})")

    # ------------------------------------------------------------------ the clients' positions
    def _sizes(self, split: str) -> tuple[Tensor, str]:
        """``(sizes [N], host name)`` of ``split``."""
        if split not in _NAMES:
            raise ValueError(f"split: must be 'train', 'test' or 'val', got {split!r}")
        if split == "val" and self.client_val_sizes is None:
            raise ValueError("split 'val': the clients hold no validation split (set data.client_validation_fraction)")
        host = _NAMES[split][2]
        return getattr(self, host), host

    def _made_for(self, what: str, split: str, make) -> Tensor:
        """``make()``, kept while the split's given positions and sizes are the same tensors, unwritten."""
        given = self._given[split][1]
        sizes = self._sizes(split)[0]
        key = (what, split, id(given), given._version, id(sizes), sizes._version)
        if key not in self._made:
            self._made = {k: v for k, v in self._made.items() if k[:2] != (what, split)}
            self._made[key] = make()
        return self._made[key]

    def flat(self, split: str = "train") -> Tensor:
        """The split's positions concatenated in client order (CSR with the sizes): 8 bytes an example."""
        sizes = self._sizes(split)[0]
        kind, given = self._given[split]
        if kind == "flat":
            return given
        return self._made_for("flat", split, lambda: given[torch.arange(given.shape[1], device=given.device)[None, :]
                                                          < sizes.to(given.device)[:, None]])

    def starts(self, split: str = "train") -> Tensor:
        """``[N]`` where each client's positions begin in :meth:`flat` (exclusive cumulative sizes), kept."""
        sizes = self._sizes(split)[0]
        return self._made_for("starts", split, lambda: torch.cumsum(sizes, 0) - sizes)

    def padded(self, split: str = "train") -> Tensor:
        """``[N, max]`` the split's positions padded with 0 (``client_index``, ``holdout_index``, ``client_val_index``),
        built on first use and kept: ``N x`` the largest client's entries (a round never builds it: :meth:`gather`)."""
        sizes, host = self._sizes(split)
        kind, given = self._given[split]
        if kind == "padded":
            return given
        return self._made_for("padded", split, lambda: _pack(given, sizes, max(self.host(host).tolist(), default=0),
                                                             self.starts(split)))

    def _set(self, split: str, kind: str, value: Tensor | None) -> None:
        if value is None:
            if split != "val":
                raise ValueError(f"{_NAMES[split][0 if kind == 'padded' else 1]}: the clients' positions, not None")
            self._given.pop(split, None)
        else:
            self._given[split] = (kind, value)

    client_index = _positions("train", "padded", "``[N, max_n]``: :meth:`padded` of the training split (settable).")
    holdout_index = _positions("test", "padded", "``[N, max_h]``: the held-out split padded (``[N, 1]`` zeros without one).")
    client_val_index = _positions("val", "padded", "``[N, max_v]``: the clients' validation split padded; None without one.")
    client_flat = _positions("train", "flat", "The training positions concatenated (:meth:`flat`; settable).")
    holdout_flat = _positions("test", "flat", "The held-out positions concatenated (:meth:`flat`).")
    client_val_flat = _positions("val", "flat", "The clients' validation positions concatenated; None without them.")

    def positions(self, clients: Tensor | None, split: str = "test") -> tuple[Tensor, Tensor]:
        """``(owner [M], idx [M])``: the split's examples of ``clients`` (None: every client) flat, each with its client,
        in client order; O(the examples), never ``N x`` the largest client."""
        sizes, flat = self._sizes(split)[0], self.flat(split)
        device = sizes.device
        if clients is None:
            return torch.repeat_interleave(torch.arange(sizes.numel(), device=device), sizes), flat
        clients = clients.to(device)
        n = sizes[clients]
        owner = torch.repeat_interleave(clients, n)
        offset = torch.arange(owner.numel(), device=device) - torch.repeat_interleave(torch.cumsum(n, 0) - n, n)
        return owner, flat[torch.repeat_interleave(self.starts(split)[clients], n) + offset]

    @property
    def num_clients(self) -> int:
        """``N``."""
        return int(self.client_sizes.numel())

    @property
    def has_validation(self) -> bool:
        """Whether a server-side validation split was set aside (``validation_fraction > 0``)."""
        return self.val_index is not None and self.val_index.numel() > 0

    @property
    def has_client_validation(self) -> bool:
        """Whether the clients hold their own validation splits (``client_validation_fraction > 0``)."""
        return self.client_val_sizes is not None and (self.host("client_val_sizes") > 0).any().tolist()

    def host(self, name: str) -> Tensor:
        """A host (CPU) copy of the per-client field ``name`` (:data:`HOST_FIELDS`), made once and kept.

        A round reads its cohort's sizes and label counts from these copies without waiting for the device
        (:mod:`lfed.engine.host`); :meth:`to` hands them on, so data moved to a device keeps the copies it was built with.
        """
        if name not in HOST_FIELDS:
            raise ValueError(f"name: one of {HOST_FIELDS}, got {name!r}")
        cache = self.__dict__.setdefault("_host", {})
        if name not in cache:
            value = getattr(self, name)
            cache[name] = None if value is None else value.detach().cpu()
        return cache[name]

    def population_label_counts(self) -> Tensor:
        """``[C]`` the whole population's training label counts on the host (DWFed's reference distribution), summed
        once and kept: a round reads it in O(C), not O(N C) (it never changes during a run)."""
        cache = self.__dict__.setdefault("_host", {})
        if "population_label_counts" not in cache:
            cache["population_label_counts"] = self.host("label_counts").sum(0)
        return cache["population_label_counts"]

    def gather(self, clients: Tensor, split: str = "train", host_clients: Tensor | None = None
               ) -> tuple[Tensor, Tensor, Tensor]:
        """``(x, y, index [K, L])``: where the examples of ``clients``' ``split`` (``train``, ``test``: the held-out
        split, ``val``: their own validation split) are: the pooled tensors themselves (no copy) and the clients' rows
        of positions, client ``i``'s examples at ``x[index[i, :n_i]]``, padded with 0 to ``L``, the cohort's largest
        size (at least 1), read from the host copies when ``host_clients`` (``clients`` on the host) is given.
        O(K L), whatever N and the largest client. The one way a round reaches a cohort's examples, whatever holds
        them (:class:`lfed.data.lazy.LazyFederatedData` makes them on demand)."""
        sizes, host = self._sizes(split)
        flat = self.flat(split)
        device = sizes.device
        clients = clients.to(device)
        if host_clients is not None:  # the host copies: no device read (lfed.engine.host)
            width = max(max(self.host(host)[host_clients].tolist(), default=0), 1)
        else:
            width = max(int(sizes[clients].max()) if clients.numel() else 0, 1)
        column = torch.arange(width, device=device)[None, :]
        valid = column < sizes[clients][:, None]
        if flat.numel() == 0:
            return self.train_x, self.train_y, torch.zeros(clients.numel(), width, dtype=torch.long, device=device)
        at = torch.where(valid, self.starts(split)[clients][:, None] + column, torch.zeros((), dtype=torch.long,
                                                                                          device=device))
        return self.train_x, self.train_y, torch.where(valid, flat[at], torch.zeros((), dtype=flat.dtype, device=device))

    def label_counts_of(self, clients: Tensor) -> Tensor:
        """``[K, C]`` the training label counts of ``clients`` (host ids), from the host copy."""
        return self.host("label_counts")[clients]

    def digests(self) -> dict[str, str]:
        """The digests of the labels and the clients' indices a checkpoint's fingerprint records
        (:func:`lfed.state.fingerprint.data_digests`), hashed once and kept.

        The data is not to change after :meth:`FederatedDataset.build`. Should one of the hashed tensors be replaced
        or written in place (a torch operation bumps its version counter) it is hashed again, so a digest never
        describes other contents than the data's; a write that torch does not count (through ``.numpy()`` or
        ``.data``) is not seen.
        """
        from lfed.state.fingerprint import data_digests

        hashed = ("train_y", "client_sizes", "client_flat", "holdout_sizes", "holdout_flat", "client_val_sizes",
                  "client_val_flat")
        now = tuple((getattr(self, f), getattr(getattr(self, f), "_version", None)) for f in hashed)
        cached = self.__dict__.get("_digests")
        if cached is None or len(cached[0]) != len(now) or any(
                a is not b or va != vb for (a, va), (b, vb) in zip(cached[0], now)):
            cached = self.__dict__["_digests"] = (now, data_digests(self))
        return dict(cached[1])

    def own_split(self, split: str = "test") -> tuple[Tensor, Tensor]:
        """``(index [N, max], sizes [N])`` of each client's own ``test`` (held-out) or ``val`` (validation) split, the
        index padded (:meth:`padded`: ``N x`` the largest; :meth:`gather` and :meth:`positions` are O(the examples)).

        Raises:
            ValueError: If ``split`` is another name, or ``val`` when the clients hold no validation split.
        """
        if split not in ("test", "val"):
            raise ValueError(f"split: must be 'test' or 'val', got {split!r}")
        return self.padded(split), self._sizes(split)[0]

    @property
    def task(self) -> str:
        """``classification`` (integer labels) or ``regression`` (floating targets)."""
        return "regression" if self.train_y.dtype.is_floating_point else "classification"

    def require_labels(self, what: str) -> None:
        """Refuse ``what`` (a setting that needs class labels) for regression data.

        Raises:
            ValueError: If the targets are floating (regression).
        """
        if self.task == "regression":
            raise ValueError(f"{what} needs class labels, but the targets are floating (regression); "
                             "use it with integer class labels, or leave it out for regression")

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None,
           converted: dict | None = None) -> FederatedData:
        """A copy on ``device``; floating inputs (and regression targets) cast to ``dtype`` if given.

        ``converted``: the copies of tensors other data already made (keyed by the tensor's id), so
        runs that share a dataset share its copy on the device (trained in one engine call).
        """
        converted = {} if converted is None else converted
        moved = object.__new__(FederatedData)
        moved.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("_made", "_digests")})
        moved._made = {}  # what is made from the positions is made again on the device where read

        def move(name: str, v: Any) -> Any:
            if not isinstance(v, Tensor):
                return v
            key = (id(v), name in ("train_x", "test_x", "train_y", "test_y"))
            if key not in converted:
                w = v.to(device)
                if dtype is not None and key[1] and w.is_floating_point():
                    w = w.to(dtype)
                converted[key] = w
            return converted[key]

        for name in self._TENSORS:
            setattr(moved, name, move(name, getattr(self, name)))
        moved._given = {split: (kind, move(f"{split}_positions", v)) for split, (kind, v) in self._given.items()}
        moved.__dict__["_host"] = {**self.__dict__.get("_host", {}),  # the host copies travel along
                                   **{name: self.host(name) for name in HOST_FIELDS}}
        return moved
