"""The population built flat (issue 65): ``partition_flat`` and ``FederatedDataset.build`` give, bit for bit, what lfed
0.5 built through a list of N tensors, for every partition scheme and several seeds.

lfed 0.5's code is kept here verbatim (``_split_by_owner``, ``flatten_indices``, ``holdout_split_flat`` and the index
part of ``FederatedDataset.build``) as the reference; the schemes' own draws (which examples a client gets) did not
change and are run with the old grouping swapped in.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import lfed.data.partition as P
from lfed.data.federated import FederatedDataset, client_validation_seed
from lfed.data.splits import label_counts_flat, pack_flat, seeded_generator, validation_split


# ----------------------------------------------------------------------------------------- lfed 0.5, verbatim
def old_split_by_owner(index: Tensor, owner: Tensor, num_clients: int, device: torch.device) -> list[Tensor]:
    """Group ``index`` by ``owner`` (values >= num_clients are left out), ascending within each client."""
    keep = owner < num_clients
    index, owner = index[keep], owner[keep]
    order = torch.argsort(owner * (int(index.max()) + 1 if index.numel() else 1) + index)
    sizes = torch.bincount(owner, minlength=num_clients)
    if bool((sizes == 0).any()):
        raise ValueError(f"client {int((sizes == 0).nonzero()[0])} would get no example; use fewer clients")
    return [part.to(device) for part in torch.split(index[order], sizes.tolist())]


def old_flatten_indices(client_indices: list[Tensor]) -> tuple[Tensor, Tensor]:
    sizes = torch.tensor([t.numel() for t in client_indices], dtype=torch.long)
    if all(t.dtype == torch.long for t in client_indices):
        return torch.cat(client_indices), sizes
    return torch.cat([t.long() for t in client_indices]), sizes


def old_holdout_split_flat(flat: Tensor, sizes: Tensor, fraction: float, seed: int = 0):
    device = flat.device
    num_clients = sizes.numel()
    held = torch.floor(sizes.double() * fraction + 0.5).long().minimum((sizes - 1).clamp(min=0))
    owner = torch.repeat_interleave(torch.arange(num_clients), sizes)
    order = torch.randperm(flat.numel(), generator=seeded_generator(seed))
    order = order[torch.argsort(owner[order], stable=True)]  # grouped by client, random within client
    rank = torch.empty_like(order)
    rank[order] = torch.arange(flat.numel()) - (torch.cumsum(sizes, 0) - sizes)[owner[order]]
    is_held = (rank < held[owner]).to(device)
    return flat[~is_held], sizes - held, flat[is_held], held


def old_partition(monkeypatch, labels, num_clients, scheme, seed, *, groups=None, **kw) -> list[Tensor]:
    """lfed 0.5's ``partition``: the scheme's draws grouped by ``old_split_by_owner`` into a list of N tensors."""
    with monkeypatch.context() as m:
        m.setattr(P, "_flat_by_owner", old_split_by_owner)
        if scheme == "natural":
            return [part.to(labels.device) for part in P._natural(groups, num_clients)]
        if scheme == "iid":
            return P._iid(labels, num_clients, seed)
        if scheme == "shards":
            return P._shards(labels, num_clients, seed, kw.get("shards_per_client", 2))
        if scheme == "dirichlet":
            return P._dirichlet(labels, num_clients, seed, kw.get("rho", 1.0), kw.get("num_classes"))
        return P._classes(labels, num_clients, seed, kw.get("classes_per_client", 2), kw.get("num_classes"))


def old_build(monkeypatch, dm: FederatedDataset) -> dict[str, Tensor]:
    """The index part of lfed 0.5's ``FederatedDataset.build`` (pack_flat and label_counts_flat did not change)."""
    ds = dm._load()
    labels = ds.train_y if ds.num_classes is not None else torch.zeros(ds.train_y.shape[0], dtype=torch.long)
    groups, val_index = ds.train_groups, None
    if dm.validation_fraction > 0:
        rest, val_index = validation_split(labels.shape[0], dm.validation_fraction, dm.seed)
        labels = labels[rest]
        groups = None if groups is None else groups[rest]
    clients = old_partition(monkeypatch, labels, dm.num_clients, dm.partition, dm.seed, groups=groups, rho=dm.rho,
                            shards_per_client=dm.shards_per_client, classes_per_client=dm.classes_per_client,
                            num_classes=ds.num_classes)
    flat, all_sizes = old_flatten_indices(clients)
    if val_index is not None:
        flat = rest.to(flat.device)[flat]
    train, sizes, held, h_sizes = old_holdout_split_flat(flat, all_sizes, dm.holdout_fraction, dm.seed)
    out = {}
    if dm.client_validation_fraction > 0:
        train, sizes, cv, cv_sizes = old_holdout_split_flat(train, sizes, dm.client_validation_fraction,
                                                            client_validation_seed(dm.seed))
        out["client_val_index"], out["client_val_sizes"] = pack_flat(cv, cv_sizes), cv_sizes.to(cv.device)
    out["client_index"], out["client_sizes"] = pack_flat(train, sizes), sizes.to(train.device)
    num = sizes.numel()
    if dm.holdout_fraction > 0:
        out["holdout_index"], out["holdout_sizes"] = pack_flat(held, h_sizes), h_sizes.to(held.device)
    else:
        out["holdout_index"], out["holdout_sizes"] = torch.zeros(num, 1, dtype=torch.long), torch.zeros(num, dtype=torch.long)
    if ds.num_classes is not None:
        out["label_counts"] = label_counts_flat(ds.train_y, train, sizes, ds.num_classes)
    if val_index is not None:
        out["val_index"] = val_index
    return out


# ----------------------------------------------------------------------------------------- the comparisons
def _identical(a: Tensor, b: Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.device == b.device and a.shape == b.shape, what
    assert torch.equal(a, b), what


def _labels(n: int, classes: int, seed: int) -> Tensor:
    return torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(seed))


SCHEMES = [("iid", {}), ("shards", {}), ("shards", {"shards_per_client": 3}), ("dirichlet", {"rho": 0.1}),
           ("dirichlet", {"rho": 5.0}), ("classes", {}), ("classes", {"classes_per_client": 3})]


@pytest.mark.filterwarnings("ignore:classes partition leaves out")
@pytest.mark.parametrize("scheme, kw", SCHEMES)
@pytest.mark.parametrize("seed", [0, 1, 12345])
@pytest.mark.parametrize("num_clients", [1, 9, 97])
def test_partition_flat_is_the_old_list_concatenated(monkeypatch, scheme, kw, seed, num_clients):
    labels = _labels(1200, 10, seed)
    old = old_partition(monkeypatch, labels, num_clients, scheme, seed, **kw)
    index, sizes = P.partition_flat(labels, num_clients, scheme, seed, **kw)
    old_flat, old_sizes = old_flatten_indices(old)
    _identical(index, old_flat, "index")
    _identical(sizes, old_sizes, "sizes")
    new = P.partition(labels, num_clients, scheme, seed, **kw)  # the list form: the same N tensors as before
    assert len(new) == len(old) and all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(new, old))


@pytest.mark.parametrize("num_clients", [None, 1, 5])
def test_natural_partition_flat_is_the_old_list_concatenated(monkeypatch, num_clients):
    g = torch.Generator().manual_seed(3)
    groups = torch.randint(0, 40, (900,), generator=g) * 7 + 3  # sparse, unordered ids
    labels = _labels(900, 10, 4)
    old = old_partition(monkeypatch, labels, num_clients, "natural", 0, groups=groups)
    index, sizes = P.partition_flat(labels, num_clients, "natural", groups=groups)
    old_flat, old_sizes = old_flatten_indices(old)
    _identical(index, old_flat, "index")
    _identical(sizes, old_sizes, "sizes")
    assert all(torch.equal(a, b) for a, b in zip(P.natural_partition(groups, num_clients), old))


def test_an_owner_left_out_and_an_empty_client_are_as_before(monkeypatch):
    """classes with N m < C' leaves examples out (owner >= N); too many clients still names the empty one."""
    labels = _labels(500, 10, 0)
    with pytest.warns(UserWarning, match="leaves out classes"):
        old = old_partition(monkeypatch, labels, 2, "classes", 0, classes_per_client=2)
    with pytest.warns(UserWarning, match="leaves out classes"):
        index, sizes = P.partition_flat(labels, 2, "classes", 0, classes_per_client=2)
    assert int(sizes.sum()) < 500
    _identical(index, old_flatten_indices(old)[0], "index")
    groups = torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="client 1 would get no example"):
        P._flat_by_owner(torch.arange(4), torch.tensor([0, 0, 2, 2]), 2, torch.device("cpu"))
    assert P.partition_flat(torch.zeros(4, dtype=torch.long), None, "natural", groups=groups)[1].tolist() == [2, 2]


@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.5, 0.9])
def test_holdout_split_flat_is_the_old_one(fraction):
    g = torch.Generator().manual_seed(1)
    sizes = torch.randint(1, 30, (200,), generator=g)
    flat = torch.randperm(int(sizes.sum()), generator=g)
    from lfed.data.splits import holdout_split_flat

    for got, want, what in zip(holdout_split_flat(flat, sizes, fraction, seed=9),
                               old_holdout_split_flat(flat, sizes, fraction, seed=9),
                               ("train", "train_sizes", "holdout", "holdout_sizes")):
        _identical(got, want, what)


BUILDS = [
    dict(partition="iid", num_clients=50, holdout_fraction=0.0),
    dict(partition="iid", num_clients=50, holdout_fraction=0.2, seed=3),
    dict(partition="shards", num_clients=30, holdout_fraction=0.2, seed=1),
    dict(partition="dirichlet", num_clients=40, rho=0.3, holdout_fraction=0.25, validation_fraction=0.1, seed=2),
    dict(partition="dirichlet", num_clients=13, rho=1.0, holdout_fraction=0.2, client_validation_fraction=0.2, seed=7),
    dict(partition="classes", num_clients=20, classes_per_client=3, holdout_fraction=0.0,
         client_validation_fraction=0.3, validation_fraction=0.2, seed=11),
]


@pytest.mark.parametrize("settings", BUILDS)
def test_build_gives_the_old_tensors(monkeypatch, settings):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2000, 3, generator=g), torch.randint(0, 10, (2000,), generator=g)
    dm = FederatedDataset.from_tensors(x[:1800], y[:1800], x[1800:], y[1800:], num_classes=10, **settings)
    want = old_build(monkeypatch, dm)
    d = dm.build()
    for name, tensor in want.items():
        _identical(getattr(d, name), tensor, name)
    assert (d.client_val_index is None) == ("client_val_index" not in want)


def test_build_of_natural_groups_gives_the_old_tensors(monkeypatch):
    """``partition: natural`` over Synthetic(1, 1)'s devices (train_groups), with held-out and validation splits."""
    dm = FederatedDataset(dataset="synthetic", partition="natural", num_clients=6, holdout_fraction=0.2,
                          validation_fraction=0.1, seed=4)
    want = old_build(monkeypatch, dm)
    d = dm.build()
    for name, tensor in want.items():
        _identical(getattr(d, name), tensor, name)


def test_build_makes_no_tensor_per_client(monkeypatch):
    """The build never splits the population into N tensors (what cost 5 of 6 CPU s at 10^6 clients)."""
    calls = []
    real = torch.split
    monkeypatch.setattr(torch, "split", lambda *a, **k: calls.append(a) or real(*a, **k))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(600, 3, generator=g), torch.randint(0, 10, (600,), generator=g)
    for scheme in ("iid", "shards", "dirichlet", "classes"):
        FederatedDataset.from_tensors(x[:500], y[:500], x[500:], y[500:], num_clients=100, partition=scheme,
                                      holdout_fraction=0.2, client_validation_fraction=0.2).build()
    assert calls == []
    P.partition(y[:500], 100, "iid")  # the list form does split (the check above can fail)
    assert len(calls) == 1
