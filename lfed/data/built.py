"""The federated data as built (:class:`FederatedData`): the pooled tensors, each client's positions in them, its held-out
and validation splits, label counts, host copies and digests. :class:`lfed.data.federated.FederatedDataset` builds it;
the round and the engine read it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from torch import Tensor

__all__ = ["FederatedData", "HOST_FIELDS"]


HOST_FIELDS = ("client_sizes", "holdout_sizes", "client_val_sizes", "label_counts")
"""The per-client fields of :class:`FederatedData` with a host copy (:meth:`FederatedData.host`)."""


@dataclass
class FederatedData:
    """Everything about the clients' data that a federated round needs.

    Not to be changed once built: a checkpoint's fingerprint hashes the labels and the clients' indices once
    (:meth:`digests`; a tensor replaced or written in place by torch is hashed again).

    Attributes:
        train_x, train_y: Pooled training examples of all clients.
        test_x, test_y: Global test set.
        client_index: ``[N, max_n]`` positions of each client's training examples.
        client_sizes: ``[N]`` number of training examples ``n_k``.
        holdout_index: ``[N, max_h]`` positions of each client's held-out examples.
        holdout_sizes: ``[N]`` (zeros when there is no held-out split).
        label_counts: ``[N, C]`` training label counts per client (DWFed, plots); ``[N, 0]``
            for regression.
        num_classes: ``C``; None for regression (floating targets).
        val_index: ``[v]`` positions in the pooled training set of the server's validation
            examples (no client holds them); None or empty when there is no validation split.
        client_val_index: ``[N, max_v]`` positions of each client's own validation examples
            (``client_validation_fraction``; no client trains on them); None when there are none.
        client_val_sizes: ``[N]`` their numbers; None when there are none.
        notes: Who the evaluation splits belong to, where not to the server alone: ``test_from_clients`` (the
            test examples are the training clients' own, LEAF's per-writer held-out data), ``val_from_clients``
            (the server's validation split was carved from those clients' examples). Under DP their metrics
            are client data (docs/privacy.md "Server-held means server-held").
        augment: The :class:`lfed.data.augment.Augmentation` of every local step's batch (None: none).
    """

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    client_index: Tensor
    client_sizes: Tensor
    holdout_index: Tensor
    holdout_sizes: Tensor
    label_counts: Tensor
    num_classes: int | None
    val_index: Tensor | None = None
    client_val_index: Tensor | None = None
    client_val_sizes: Tensor | None = None
    notes: frozenset = frozenset()
    augment: Any = None
    #: A pooled population (every example in memory); :class:`lfed.data.lazy.LazyFederatedData` is the other kind.
    lazy: ClassVar[bool] = False

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

    def gather(self, clients: Tensor, split: str = "train") -> tuple[Tensor, Tensor, Tensor]:
        """``(x, y, index [K, L])``: where the examples of ``clients``' ``split`` (``train``, ``test``: the held-out
        split, ``val``: their own validation split) are: the pooled tensors themselves (no copy) and the clients' rows
        of the split's index, client ``i``'s examples at ``x[index[i, :n_i]]``. The one way a round reaches a cohort's
        examples, whatever holds them (:class:`lfed.data.lazy.LazyFederatedData` makes them on demand)."""
        index = self.client_index if split == "train" else self.own_split(split)[0]
        return self.train_x, self.train_y, index[clients.to(index.device)]

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

        hashed = ("train_y", "client_sizes", "client_index", "holdout_sizes", "holdout_index", "client_val_sizes",
                  "client_val_index")
        now = tuple((getattr(self, f), getattr(getattr(self, f), "_version", None)) for f in hashed)
        cached = self.__dict__.get("_digests")
        if cached is None or len(cached[0]) != len(now) or any(
                a is not b or va != vb for (a, va), (b, vb) in zip(cached[0], now)):
            cached = self.__dict__["_digests"] = (now, data_digests(self))
        return dict(cached[1])

    def own_split(self, split: str = "test") -> tuple[Tensor, Tensor]:
        """``(index [N, max], sizes [N])`` of each client's own ``test`` (held-out) or ``val`` (validation) split.

        Raises:
            ValueError: If ``split`` is another name, or ``val`` when the clients hold no validation split.
        """
        if split == "test":
            return self.holdout_index, self.holdout_sizes
        if split == "val":
            if self.client_val_index is None or self.client_val_sizes is None:
                raise ValueError("split 'val': the clients hold no validation split (set data.client_validation_fraction)")
            return self.client_val_index, self.client_val_sizes
        raise ValueError(f"split: must be 'test' or 'val', got {split!r}")

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
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                key = (id(v), f.name in ("train_x", "test_x", "train_y", "test_y"))
                if key not in converted:
                    w = v.to(device)
                    if dtype is not None and key[1] and w.is_floating_point():
                        w = w.to(dtype)
                    converted[key] = w
                v = converted[key]
            out[f.name] = v
        moved = FederatedData(**out)
        moved.__dict__["_host"] = {**self.__dict__.get("_host", {}),  # the host copies travel along
                                   **{name: self.host(name) for name in HOST_FIELDS}}
        return moved
