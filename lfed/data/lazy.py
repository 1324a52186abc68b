"""A population whose examples are made per client when a cohort trains: :class:`LazyFederatedData` over a
:class:`ClientSource` (issue 65; docs/algorithms.md §8.1).

A pooled :class:`~lfed.data.built.FederatedData` holds every client's examples in memory. FedProx's Synthetic(1, 1)
at 10^6 devices is ~4.5 x 10^8 examples (~110 GB), at 10^7 ten times that: no pool. A :class:`ClientSource` makes
client ``k``'s examples alone, at the cost of its own examples (a seeded generator:
:class:`lfed.data.synthetic.SyntheticSource`), and :class:`LazyFederatedData` is what a round reads of such a
population: the clients' sizes (``[N]``, 8 bytes a client), and :meth:`LazyFederatedData.gather`, the cohort's
examples made on demand and indexed like a pool's rows. Every round's work is then its cohort's.

What a lazy population does not have, and so refuses before round 0 (naming the setting):

* held-out or validation splits carved from the clients' examples (``holdout_fraction``, ``validation_fraction``,
  ``client_validation_fraction`` must be 0): the global test set is the test shares of a seeded sample of
  ``test_devices`` devices (all of them when there are no more), made once at build;
* the population's label counts (DWFed's reference distribution: a pass over every example);
* a pooled training set to poison (label flipping, backdoors).

Training is the same as on the materialized population: the cohort's rows are the same examples in the same order,
so a round's batches and updates are the same numbers (tests/data/test_lazy.py compares them).
"""

from __future__ import annotations

import copy
import hashlib
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from lfed.data.built import HOST_FIELDS
from lfed.rng import derive_seed

__all__ = ["ClientSource", "LazyFederatedData", "evaluation_devices"]


@runtime_checkable
class ClientSource(Protocol):
    """A population made one client at a time (the contract of :class:`LazyFederatedData`).

    ``sizes()`` and ``client(k)`` must be pure functions of the source's settings: a client's examples are made again
    every time it is drawn, and a checkpoint resumes by making them again.
    """

    #: Name of the dataset (``synthetic``).
    name: str
    #: Number of classes ``C`` (class labels ``0..C-1``).
    num_classes: int

    def sizes(self) -> Tensor:
        """``[N]`` long, on the host: each client's number of training examples."""

    def client(self, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Client ``k``'s ``(train_x, train_y, test_x, test_y)``."""

    def identity(self) -> str:
        """A string naming the source's settings (its digest is the checkpoint fingerprint's ``train_labels``)."""


def evaluation_devices(num_clients: int, test_devices: int | None, seed: int) -> Tensor:
    """The devices whose test shares form the test set: all of them when there are at most ``test_devices``, else a
    seeded sample of ``test_devices`` (sorted), drawn from ``(seed, "test_devices")``."""
    if test_devices is None or test_devices >= num_clients:
        return torch.arange(num_clients)
    g = torch.Generator().manual_seed(derive_seed(seed, 0, "test_devices"))
    return torch.randperm(num_clients, generator=g)[:test_devices].sort().values


class LazyFederatedData:
    """What a round reads of a population made per client (module docstring); the interface of
    :class:`~lfed.data.built.FederatedData` less its pool.

    Args:
        source: The :class:`ClientSource`.
        test_devices: The test set is the test shares of this many devices, a seeded sample (all devices when there
            are no more); None: every device's.
        seed: Seed of that sample.

    Attributes:
        train_x, train_y: A specimen: device 0's training share, for shapes and dtypes (the model's input size, the
            task). The population's examples are :meth:`gather`'s; there is no ``client_index`` into a pool.
        test_x, test_y: The test shares of the test devices, pooled in device order.
        client_sizes: ``[N]`` each device's training examples.
        holdout_sizes, holdout_index: ``[N]`` zeros and ``[N, 1]`` zeros: no held-out splits.
    """

    lazy = True
    val_index = client_val_index = client_val_sizes = None
    augment = None

    def __init__(self, source: ClientSource, test_devices: int | None = None, seed: int = 0) -> None:
        if not isinstance(source, ClientSource):
            raise ValueError(f"source: a ClientSource (sizes(), client(k), identity()), got {type(source).__name__}")
        self.source = source
        self.num_classes = int(source.num_classes)
        sizes = source.sizes()
        if not isinstance(sizes, Tensor) or sizes.dim() != 1 or sizes.numel() < 1 or bool((sizes < 1).any()):
            raise ValueError("source.sizes(): a [N] tensor of training sizes >= 1, N >= 1")
        self.client_sizes = sizes.long()
        n = self.client_sizes.numel()
        self.holdout_sizes = torch.zeros(n, dtype=torch.long)
        self.holdout_index = torch.zeros(n, 1, dtype=torch.long)
        self.test_devices = evaluation_devices(n, test_devices, seed)
        xs, ys = [], []
        for k in self.test_devices.tolist():
            _, _, x, y = source.client(k)
            xs.append(x)
            ys.append(y)
        self.test_x, self.test_y = torch.cat(xs), torch.cat(ys)
        self.train_x, self.train_y = source.client(0)[:2]
        self.notes = frozenset({"test_from_clients"})  # the test examples are the devices' own (docs/privacy.md)
        self.device = torch.device("cpu")
        self.dtype: torch.dtype | None = None
        self._host = {"client_sizes": self.client_sizes, "holdout_sizes": self.holdout_sizes, "client_val_sizes": None}
        self._last: tuple | None = None

    # ------------------------------------------------------------------ the interface of FederatedData
    @property
    def num_clients(self) -> int:
        return int(self.client_sizes.numel())

    has_validation = False
    has_client_validation = False

    @property
    def task(self) -> str:
        return "classification"

    def require_labels(self, what: str) -> None:
        """Class labels always: nothing to refuse."""

    def host(self, name: str) -> Tensor | None:
        """A host copy of a per-client field; ``label_counts`` are not kept (:meth:`label_counts_of`)."""
        if name not in HOST_FIELDS:
            raise ValueError(f"name: one of {HOST_FIELDS}, got {name!r}")
        if name == "label_counts":
            raise ValueError("label_counts: a population made per client (data.lazy) keeps no [N, C] label counts; "
                             "a round reads its cohort's (label_counts_of)")
        return self._host[name]

    @property
    def client_index(self) -> Tensor:
        raise AttributeError("client_index: a population made per client (data.lazy) has no pooled training set to "
                             "index; gather(clients) makes the cohort's examples")

    def population_label_counts(self) -> None:
        """None: the population's label counts would take a pass over every example (refused by DWFed's check)."""
        return None

    def label_counts_of(self, clients: Tensor) -> Tensor:
        """``[K, C]`` long on the host: the label counts of ``clients`` (host ids), from their gathered examples."""
        _, y, index = self._gather(clients)
        sizes = self._host["client_sizes"][clients.cpu()]
        valid = torch.arange(index.shape[1])[None, :] < sizes[:, None]
        owner = torch.arange(index.shape[0])[:, None].expand_as(valid)[valid]
        key = owner * self.num_classes + y[index[valid]]
        return torch.bincount(key, minlength=index.shape[0] * self.num_classes).reshape(-1, self.num_classes)

    def gather(self, clients: Tensor, split: str = "train", host_clients: Tensor | None = None
               ) -> tuple[Tensor, Tensor, Tensor]:
        """``(x, y, index [K, L])``: the training examples of ``clients`` made now (on the data's device, inputs in its
        dtype), client ``i``'s at ``index[i, :n_i]`` (``L`` the cohort's largest size; padding 0). The last cohort's
        are kept, so a round that reads them twice (start losses, training, label counts) makes them once.

        Raises:
            ValueError: For another ``split`` than ``train`` (a lazy population has no held-out splits).
        """
        if split != "train":
            raise ValueError(f"split {split!r}: a population made per client (data.lazy) has no held-out or validation "
                             "splits")
        x, y, index = self._gather(clients if host_clients is None else host_clients)
        x = x.to(self.device)
        if self.dtype is not None and x.is_floating_point():
            x = x.to(self.dtype)
        return x, y.to(self.device), index.to(self.device)

    def _gather(self, clients: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        ids = tuple(clients.detach().cpu().long().tolist())
        if self._last is not None and self._last[0] == ids:
            return self._last[1]
        xs, ys = [], []
        for k in ids:
            x, y = self.source.client(k)[:2]
            xs.append(x)
            ys.append(y)
        sizes = torch.tensor([y.shape[0] for y in ys], dtype=torch.long)
        width = max(sizes.tolist(), default=0)
        starts = torch.cumsum(sizes, 0) - sizes
        column = torch.arange(max(width, 1))[None, :]
        index = torch.where(column < sizes[:, None], starts[:, None] + column, torch.zeros((), dtype=torch.long))
        if xs:
            gathered = (torch.cat(xs), torch.cat(ys), index)
        else:
            gathered = (self.train_x[:0], self.train_y[:0], index[:0])
        self._last = (ids, gathered)
        return gathered

    def digests(self) -> dict[str, str]:
        """The fingerprint's digests: the source's settings (``train_labels``: the labels are its function) and the
        clients' sizes."""
        from lfed.state.fingerprint import tensor_digest

        sizes = tensor_digest(self.client_sizes)
        return {"train_labels": hashlib.sha256(self.source.identity().encode()).hexdigest()[:16],
                "client_indices": sizes, "client_sizes": sizes}

    @property
    def train_examples(self) -> int:
        """The population's training examples (never made together)."""
        return int(self.client_sizes.sum())

    def own_split(self, split: str = "test") -> tuple[Tensor, Tensor]:
        if split == "test":
            return self.holdout_index, self.holdout_sizes
        raise ValueError("split 'val': the clients hold no validation split (set data.client_validation_fraction)")

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None, converted: dict | None = None
           ) -> LazyFederatedData:
        """A copy whose gathers land on ``device`` (floating inputs cast to ``dtype``); the evaluation tensors moved."""
        out = copy.copy(self)
        out.device, out.dtype = torch.device(device), dtype
        for name in ("train_x", "test_x"):
            t = getattr(self, name).to(device)
            setattr(out, name, t.to(dtype) if dtype is not None and t.is_floating_point() else t)
        for name in ("train_y", "test_y", "client_sizes", "holdout_sizes", "holdout_index"):
            setattr(out, name, getattr(self, name).to(device))
        out._last = None
        return out
