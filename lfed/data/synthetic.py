"""FedProx's Synthetic(α, β): a population of devices, each a pure function of ``(seed, k)`` (docs/algorithms.md §8.1).

Li et al. 2020, "Federated Optimization in Heterogeneous Networks" (MLSys), §5.1 and Appendix C.1, after
Shamir et al. 2014; lfed follows the reference generator of the paper's repository
(``litian96/FedProx``, ``data/synthetic_*/generate_*.py``) where the text leaves a choice. Device ``k``:

* size ``n_k = floor(exp(4 + 2 z)) + 50``, ``z ~ N(0, 1)``: ``np.random.lognormal(4, 2).astype(int) + 50``;
* ``u_k ~ N(0, α²)``, ``B_k ~ N(0, β²)`` (the reference's ``np.random.normal(0, alpha)`` takes α as the standard
  deviation; the paper's ``N(0, α)`` reads as a variance, the same thing at α ∈ {0, 1});
* ``W_k ~ N(u_k, 1)`` of ``[60, 10]`` and ``b_k ~ N(u_k, 1)`` of ``[10]``, one ``u_k`` for both;
* ``v_k ~ N(B_k, 1)`` of ``[60]``;
* ``x ~ N(v_k, Σ)``, ``Σ`` diagonal with ``Σ_jj = j^-1.2`` (``j = 1..60``), and ``y = argmax(x W_k + b_k)``
  (the softmax does not change the argmax);
* the first ``floor(0.9 n_k)`` examples train, the rest are the device's test share (the reference's
  ``train_len = int(0.9 * num_samples)``; the paper's text says 80/20: ``test_fraction=0.2``). The reference shuffles
  before its cut; the examples are i.i.d. given the device's parameters, so the cut alone is the same in law.

``iid=True`` is the reference's Synthetic-IID (``synthetic_iid/generate_iid.py``): one ``W, b ~ N(0, 1)`` shared by
every device, drawn from ``(seed, "synthetic/global")``, and ``v_k = 0``. With α = β = 0 and ``iid=False`` (the
reference's Synthetic(0, 0)) every ``u_k`` and ``B_k`` is 0, so every device draws ``W_k``, ``b_k`` and ``v_k`` from
the same law, but each its own draw: the devices' models differ; only Synthetic-IID gives them one model.

Everything of device ``k`` comes from one generator seeded with ``derive_seed(seed, k, "synthetic/client")``
(:mod:`lfed.rng`), in a fixed order: 673 standard normals (its size, ``u_k``, ``B_k``, ``v_k``, ``W_k``, ``b_k``, in
that order, whatever α, β and ``iid``), then its ``n_k x 60`` input noise. So device ``k`` is regenerated alone at
the cost of its own examples, whatever the population: what a lazy, cohort-only gather needs
(:func:`client_data`). :func:`population` materializes devices ``0..N-1`` for :class:`~lfed.data.federated.FederatedDataset`
(``dataset: synthetic``, ``partition: natural``): the training shares pooled with ``train_groups = k``, the
test shares pooled as the global test set with ``test_groups = k`` (FedProx's test accuracy: all devices' test
examples). Inputs are ``float32``; labels are the argmax computed in float64 on the ``float32`` inputs the model sees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from lfed.checks import number
from lfed.data.tensors import DatasetTensors
from lfed.rng import derive_seed

__all__ = ["CLASSES", "FEATURES", "Synthetic", "SyntheticClient", "SyntheticSource", "client_data", "client_parameters", "client_size",
           "client_sizes", "covariance_diagonal", "labels", "population"]

#: Input dimension and number of classes (§5.1: ``x ∈ R^60``, 10 classes).
FEATURES, CLASSES = 60, 10
#: Standard normals a device draws before its examples: size, u_k, B_k, v_k [60], W_k [60 x 10], b_k [10].
_HEADER = 1 + 1 + 1 + FEATURES + FEATURES * CLASSES + CLASSES
_CLIENT_STREAM, _GLOBAL_STREAM = "synthetic/client", "synthetic/global"


def covariance_diagonal(dtype: torch.dtype = torch.float64) -> Tensor:
    """``[60]`` the diagonal of ``Σ``: ``Σ_jj = j^-1.2`` for ``j = 1..60``."""
    return torch.arange(1, FEATURES + 1, dtype=torch.float64).pow(-1.2).to(dtype)


@dataclass(frozen=True)
class Synthetic:
    """The settings of a Synthetic(α, β) population (module docstring).

    Args:
        alpha: α >= 0, the spread of the devices' models (``u_k ~ N(0, α²)``).
        beta: β >= 0, the spread of the devices' input means (``B_k ~ N(0, β²)``).
        iid: The reference's Synthetic-IID: one shared model, ``v_k = 0`` (α and β are then not read).
        seed: The population's seed.
        test_fraction: The share of each device's examples that is its test share, in ``(0, 1)``: the first
            ``floor((1 - test_fraction) n_k)`` examples train (``n_k >= 50``, so every device has both shares for
            fractions in ``[0.02, 0.98]``). 0.1 as the reference generator; 0.2 as the paper's text.
    """

    alpha: float = 1.0
    beta: float = 1.0
    iid: bool = False
    seed: int = 0
    test_fraction: float = 0.1

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            object.__setattr__(self, name, number(name, getattr(self, name), at_least=0))
        if not isinstance(self.iid, bool):
            raise ValueError(f"iid: must be true or false, got {self.iid!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed: must be an int, got {self.seed!r}")
        object.__setattr__(self, "test_fraction", number("test_fraction", self.test_fraction, above=0, below=1))

    @property
    def name(self) -> str:
        """``synthetic_iid`` or ``synthetic_<α>_<β>`` (the reference's folder names, e.g. ``synthetic_1_1``)."""
        return "synthetic_iid" if self.iid else f"synthetic_{self.alpha:g}_{self.beta:g}"


class SyntheticClient(NamedTuple):
    """Device ``k``'s parameters and examples (:func:`client_data`)."""

    W: Tensor  # [60, 10] float64
    b: Tensor  # [10] float64
    v: Tensor  # [60] float64, the mean of its inputs
    u: float
    B: float
    train_x: Tensor  # [floor((1 - f) n_k), 60] float32
    train_y: Tensor  # long
    test_x: Tensor  # [the rest, 60] float32
    test_y: Tensor


def _client_id(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k: a device id, an int >= 0, got {k!r}")
    return k


def _generator(seed: int, k: int, stream: str = _CLIENT_STREAM) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, k, stream))


def _size(z: float) -> int:
    return int(math.exp(4.0 + 2.0 * z)) + 50


def client_size(spec: Synthetic, k: int) -> int:
    """``n_k`` (training and test share together): ``floor(exp(4 + 2 z_k)) + 50`` with ``z_k`` device k's first draw.

    The whole header is drawn (torch draws 16 normals or more another way than fewer: ``randn(1)`` is not the
    first of ``randn(673)``)."""
    z = torch.randn(_HEADER, generator=_generator(spec.seed, _client_id(k)), dtype=torch.float64)
    return _size(float(z[0]))


def client_sizes(spec: Synthetic, num_clients: int) -> Tensor:
    """``[N]`` the sizes ``n_k`` of devices ``0..N-1`` (one generator and one draw each)."""
    return torch.tensor([client_size(spec, k) for k in range(num_clients)], dtype=torch.long)


def client_parameters(spec: Synthetic, k: int, generator: torch.Generator | None = None
                      ) -> tuple[int, Tensor, Tensor, Tensor, float, float]:
    """``(n_k, W_k, b_k, v_k, u_k, B_k)`` of device ``k``; ``generator``: its generator, left just after the header."""
    g = _generator(spec.seed, _client_id(k)) if generator is None else generator
    z = torch.randn(_HEADER, generator=g, dtype=torch.float64)
    n = _size(float(z[0]))
    u, B = spec.alpha * float(z[1]), spec.beta * float(z[2])
    at = 3
    v = B + z[at:at + FEATURES]
    at += FEATURES
    W = u + z[at:at + FEATURES * CLASSES].view(FEATURES, CLASSES)
    at += FEATURES * CLASSES
    b = u + z[at:at + CLASSES]
    if spec.iid:  # Synthetic-IID: the shared model, inputs centred (the device's own draws above are unused)
        shared = torch.randn(FEATURES * CLASSES + CLASSES, generator=_generator(spec.seed, 0, _GLOBAL_STREAM),
                             dtype=torch.float64)
        W, b, v = shared[:FEATURES * CLASSES].view(FEATURES, CLASSES), shared[FEATURES * CLASSES:], torch.zeros(FEATURES,
                                                                                                              dtype=torch.float64)
    return n, W.clone(), b.clone(), v.clone(), u, B


def labels(x: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """``argmax(x W + b)`` in float64 (``x`` as the model sees it), ``long``."""
    return (x.double() @ W + b).argmax(-1)


def client_data(spec: Synthetic, k: int) -> SyntheticClient:
    """Device ``k`` alone: its parameters and its examples, the same as its rows in :func:`population`."""
    g = _generator(spec.seed, _client_id(k))
    n, W, b, v, u, B = client_parameters(spec, k, g)
    noise = torch.randn(n, FEATURES, generator=g, dtype=torch.float64)
    x = (v + noise * covariance_diagonal().sqrt()).float()
    y = labels(x, W, b)
    n_train = int((1.0 - spec.test_fraction) * n)
    return SyntheticClient(W, b, v, u, B, x[:n_train], y[:n_train], x[n_train:], y[n_train:])


def train_sizes(spec: Synthetic, sizes: Tensor) -> Tensor:
    """``[N]`` each device's training share ``floor((1 - f) n_k)`` of its sizes ``n_k`` (as :func:`client_data` cuts)."""
    return ((1.0 - spec.test_fraction) * sizes.double()).long()


@dataclass(frozen=True)
class SyntheticSource:
    """Devices ``0..num_clients-1`` of ``spec`` made one at a time (:func:`client_data`): the
    :class:`~lfed.data.lazy.ClientSource` of ``data.lazy: true``, a population that is never materialized whole."""

    spec: Synthetic
    num_clients: int
    name = "synthetic"
    num_classes = CLASSES

    def __post_init__(self) -> None:
        if isinstance(self.num_clients, bool) or not isinstance(self.num_clients, int) or self.num_clients < 1:
            raise ValueError(f"num_clients: the number of devices, an int >= 1, got {self.num_clients!r}")

    def sizes(self) -> Tensor:
        """``[N]`` the devices' training shares (one generator and one header draw each: ~20 µs a device)."""
        return train_sizes(self.spec, client_sizes(self.spec, self.num_clients))

    def client(self, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if not 0 <= k < self.num_clients:
            raise ValueError(f"k: a device of 0..{self.num_clients - 1}, got {k}")
        c = client_data(self.spec, k)
        return c.train_x, c.train_y, c.test_x, c.test_y

    def identity(self) -> str:
        return f"{self.spec!r}/{self.num_clients}"


def population(spec: Synthetic, num_clients: int) -> DatasetTensors:
    """Devices ``0..N-1`` materialized: training shares pooled in device order with ``train_groups = k``, test shares
    pooled as the test set with ``test_groups = k``.

    Memory is that of the examples (``E[n_k] = e^6 + 50 ≈ 453``, 240 bytes an example), about 110 MB per 1,000
    devices; the sizes are heavy-tailed (the largest of 1,000 is typically ~30,000).
    """
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise ValueError(f"num_clients: the number of devices, an int >= 1, got {num_clients!r}")
    sizes = client_sizes(spec, num_clients)
    n_train = train_sizes(spec, sizes)  # int((1 - f) * n_k) of client_data, for all k
    n_test = sizes - n_train
    out = {}
    for split, counts in (("train", n_train), ("test", n_test)):
        out[f"{split}_x"] = torch.empty(int(counts.sum()), FEATURES, dtype=torch.float32)
        out[f"{split}_y"] = torch.empty(int(counts.sum()), dtype=torch.long)
        out[f"{split}_groups"] = torch.repeat_interleave(torch.arange(num_clients), counts)
    starts = {"train": 0, "test": 0}
    for k in range(num_clients):
        c = client_data(spec, k)
        for split, x, y in (("train", c.train_x, c.train_y), ("test", c.test_x, c.test_y)):
            lo = starts[split]
            out[f"{split}_x"][lo:lo + x.shape[0]] = x
            out[f"{split}_y"][lo:lo + y.shape[0]] = y
            starts[split] = lo + x.shape[0]
    return DatasetTensors("synthetic", out["train_x"], out["train_y"], out["test_x"], out["test_y"], CLASSES,
                          train_groups=out["train_groups"], test_groups=out["test_groups"])
