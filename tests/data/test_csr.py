"""The clients' positions stored flat (CSR: ``client_flat`` with the sizes, issue 65): a round gathers its cohort's rows
(``FederatedData.gather``) and an evaluation its clients' examples (``positions``) in O(their examples); the padded
``[N, max n_k]`` index is made only where old code reads it. A skewed population (one large client among many small
ones, StackOverflow-like) trains and evaluates without it.
"""

from __future__ import annotations

import torch

from lfed.core import registry as algorithms
from lfed.core.algorithm import LocalTraining, setup_state
from lfed.core.round import run_round
from lfed.data.built import FederatedData
from lfed.data.federated import FederatedDataset
from lfed.engine import CohortTrainer
from lfed.evaluation.scores import client_evaluation
from lfed.models import MLP
from lfed.state.spec import ModuleStateStore


def _data(**kw) -> FederatedData:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(900, 4, generator=g), torch.randint(0, 3, (900,), generator=g)
    return FederatedDataset.from_tensors(x[:800], y[:800], x[800:], y[800:], num_clients=30, partition="dirichlet",
                                         rho=0.3, num_classes=3, **kw).build()


def _made(d: FederatedData, what: str) -> set:
    return {k[1] for k in d._made if k[0] == what}


def test_the_gather_and_the_positions_are_the_padded_rows():
    d = _data(holdout_fraction=0.25, client_validation_fraction=0.2)
    clients = torch.tensor([7, 0, 29, 7, 12])
    for split, sizes in (("train", d.client_sizes), ("test", d.holdout_sizes), ("val", d.client_val_sizes)):
        _, _, rows = d.gather(clients, split)
        padded = d.padded(split)
        n = sizes[clients]
        assert rows.shape == (5, max(int(n.max()), 1))  # the cohort's largest, not the population's
        for i, k in enumerate(clients.tolist()):
            assert torch.equal(rows[i, : n[i]], padded[k, : n[i]]) and bool((rows[i, n[i]:] == 0).all())
        owner, idx = d.positions(clients, split)
        valid = torch.arange(padded.shape[1])[None, :] < n[:, None]
        assert torch.equal(idx, padded[clients][valid]) and torch.equal(owner, clients[:, None].expand_as(valid)[valid])
    assert d.client_flat.numel() == int(d.client_sizes.sum())  # 8 bytes an example
    assert torch.equal(d.starts(), torch.cumsum(d.client_sizes, 0) - d.client_sizes)


def test_data_given_padded_is_the_same_data():
    d = _data(holdout_fraction=0.25)
    again = FederatedData(d.train_x, d.train_y, d.test_x, d.test_y, d.client_index, d.client_sizes, d.holdout_index,
                          d.holdout_sizes, d.label_counts, d.num_classes)
    assert torch.equal(again.client_flat, d.client_flat) and torch.equal(again.holdout_flat, d.holdout_flat)
    assert again.digests() == d.digests()
    moved = d.to("cpu", torch.float64)
    assert torch.equal(moved.client_flat, d.client_flat) and moved.train_x.dtype == torch.float64
    assert torch.equal(moved.client_index, d.client_index)


def test_a_skewed_population_trains_and_evaluates_without_its_padded_index():
    """2,001 clients: one of 20,000 examples and 2,000 of 3. Padded, the index would be 2,001 x 20,000 (320 MB);
    a round of 4 clients and the evaluation of every client's held-out example make nothing of that size."""
    sizes = [20_000] + [3] * 2_000
    groups = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    g = torch.Generator().manual_seed(1)
    n = groups.numel()
    x, y = torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)
    dm = FederatedDataset.from_tensors(x, y, x[:50], y[:50], num_clients=len(sizes), partition="natural",
                                       holdout_fraction=0.34, num_classes=3)
    dm._user_train = None  # natural groups of one's own tensors: as a LEAF dataset gives them
    from lfed.data.tensors import DatasetTensors

    dm.use_dataset(DatasetTensors("custom", x, y, x[:50], y[:50], 3, train_groups=groups))
    d = dm.build()
    assert int(d.client_sizes.max()) > 10_000 and d.num_clients == 2_001
    net = MLP(4, [8], 3)
    engine = CohortTrainer(net, torch.nn.functional.cross_entropy, "vmap")
    w = engine.layout.module_vector(net).detach()
    alg = algorithms.build(algorithms.resolve("fedavg"))
    setup_state(alg, ModuleStateStore(), d.client_sizes, w.numel(), w)
    plan = LocalTraining(client_lr=0.1, batch_size=2, local_steps=2)
    w1, rec = run_round(alg, w, d, plan, engine, round=0, clients=torch.tensor([5, 9, 1000, 2000]))
    assert torch.isfinite(w1).all() and not torch.equal(w1, w)
    acc, _ = client_evaluation(net, d, 0, 1, lambda t: t)
    assert int((~torch.isnan(acc)).sum()) == 2_001
    assert not _made(d, "padded")  # neither the training nor the held-out index was padded
