"""A population made per client (lfed/data/lazy.py): the cohort's examples gathered on demand are the materialized
population's, so a round trains the same; what it cannot do is refused before round 0.

By hand: a tiny Synthetic(1, 1) of 7 devices, materialized (``lazy: false``) and made per client (``lazy: true``).
"""

from __future__ import annotations

import pytest
import torch

from lfed.core import registry as algorithms
from lfed.core.algorithm import LocalTraining, setup_state
from lfed.core.round import run_round
from lfed.data.federated import FederatedDataset
from lfed.data.lazy import ClientSource, LazyFederatedData, evaluation_devices
from lfed.data.synthetic import Synthetic, SyntheticSource, client_data, client_sizes
from lfed.engine import CohortTrainer
from lfed.models import LogisticRegression
from lfed.state.spec import ModuleStateStore

N = 7


def _both(**kw):
    common = dict(dataset="synthetic", num_clients=N, partition="natural", holdout_fraction=0.0, seed=3, **kw)
    return FederatedDataset(**common).build(), FederatedDataset(lazy=True, test_devices=N, **common).build()


def test_the_gather_is_the_materialized_population_rows():
    pooled, lazy = _both()
    assert isinstance(lazy, LazyFederatedData) and lazy.lazy and not pooled.lazy
    assert torch.equal(lazy.client_sizes, pooled.client_sizes)
    assert torch.equal(lazy.test_x, pooled.test_x) and torch.equal(lazy.test_y, pooled.test_y)
    clients = torch.tensor([5, 1, 3])
    px, py, pi = pooled.gather(clients)
    lx, ly, li = lazy.gather(clients)
    assert li.shape == (3, int(pooled.client_sizes[clients].max()))
    for row, k in enumerate(clients.tolist()):
        n = int(pooled.client_sizes[k])
        c = client_data(Synthetic(1.0, 1.0, seed=3), k)
        assert torch.equal(lx[li[row, :n]], px[pi[row, :n]]) and torch.equal(lx[li[row, :n]], c.train_x)
        assert torch.equal(ly[li[row, :n]], py[pi[row, :n]])
        assert bool((li[row, n:] == 0).all())  # padding
    assert torch.equal(lazy.label_counts_of(clients), pooled.label_counts_of(clients))
    assert lazy.label_counts_of(clients).sum(1).tolist() == pooled.client_sizes[clients].tolist()
    assert lazy.gather(clients)[0] is not None and lazy._last[0] == (5, 1, 3)  # made once per cohort


@pytest.mark.bitlevel
@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_a_round_on_it_equals_the_round_on_the_pool(algorithm):
    pooled, lazy = _both()
    plan = LocalTraining(client_lr=0.05, batch_size=10, local_steps=3)
    out = []
    for data in (pooled, lazy):
        torch.manual_seed(0)
        net = LogisticRegression(60, 10)
        engine = CohortTrainer(net, torch.nn.functional.cross_entropy, "vmap")
        w = engine.layout.module_vector(net).detach()
        alg = algorithms.build(algorithms.resolve(algorithm))
        setup_state(alg, ModuleStateStore(), data.client_sizes, w.numel(), w)
        for r in range(2):
            w, rec = run_round(alg, w, data, plan, engine, round=r, seed=1, clients=torch.tensor([4, 0, 6]))
        out.append(w)
    assert torch.equal(out[0], out[1])  # same machine, same shapes of every batch: the same bits


def test_a_seeded_sample_of_test_devices():
    d = evaluation_devices(1000, 10, seed=2)
    assert d.tolist() == sorted(set(d.tolist())) and d.numel() == 10 and int(d.max()) < 1000
    assert torch.equal(d, evaluation_devices(1000, 10, seed=2)) and not torch.equal(d, evaluation_devices(1000, 10, 3))
    assert torch.equal(evaluation_devices(5, 10, 0), torch.arange(5)) and torch.equal(evaluation_devices(5, None, 0),
                                                                                       torch.arange(5))
    common = dict(dataset="synthetic", num_clients=N, partition="natural", holdout_fraction=0.0, seed=3, test_devices=3)
    pooled, lazy = FederatedDataset(**common).build(), FederatedDataset(lazy=True, **common).build()
    spec = Synthetic(1.0, 1.0, seed=3)
    want = torch.cat([client_data(spec, k).test_x for k in evaluation_devices(N, 3, 3).tolist()])
    assert torch.equal(lazy.test_x, want) and torch.equal(pooled.test_x, want)


def test_sizes_without_the_examples():
    src = SyntheticSource(Synthetic(seed=1), 50)
    assert isinstance(src, ClientSource)
    n = client_sizes(Synthetic(seed=1), 50)
    assert torch.equal(src.sizes(), (0.9 * n.double()).long())
    with pytest.raises(ValueError, match="k: a device of 0..49"):
        src.client(50)


def test_what_a_lazy_population_refuses_names_the_setting():
    common = dict(dataset="synthetic", num_clients=N, partition="natural", holdout_fraction=0.0)
    with pytest.raises(ValueError, match="test_devices: with lazy"):
        FederatedDataset(lazy=True, **common)
    with pytest.raises(ValueError, match="holdout_fraction: must be 0 with lazy"):
        FederatedDataset(lazy=True, test_devices=3, **{**common, "holdout_fraction": 0.2})
    with pytest.raises(ValueError, match="validation_fraction: must be 0 with lazy"):
        FederatedDataset(lazy=True, test_devices=3, validation_fraction=0.1, **common)
    with pytest.raises(ValueError, match="lazy: a population made per client is dataset 'synthetic'"):
        FederatedDataset(dataset="digits", lazy=True, test_devices=3)
    with pytest.raises(ValueError, match="test_devices: a number of devices >= 1"):
        FederatedDataset(test_devices=0, **common)
    lazy = FederatedDataset(lazy=True, test_devices=3, **common).build()
    with pytest.raises(AttributeError, match="client_index: a population made per client"):
        _ = lazy.client_index
    with pytest.raises(ValueError, match="has no held-out"):
        lazy.gather(torch.tensor([0]), split="test")
    assert lazy.population_label_counts() is None


def test_components_that_need_the_pool_are_refused_before_round_0():
    from lfed.base.component import CompositionContext

    lazy = FederatedDataset(dataset="synthetic", num_clients=N, partition="natural", holdout_fraction=0.0, lazy=True,
                            test_devices=3).build()
    alg = algorithms.build(algorithms.resolve("dwfed"))
    ctx = CompositionContext(explicit=frozenset(), data=lazy)
    with pytest.raises(ValueError, match="weighting='dwfed'.*data.lazy"):
        alg.weighting.check(ctx)
    from lfed.robust.attacks.label_flip import LabelFlip

    with pytest.raises(ValueError, match="attack='label_flip' poisons the pooled training set"):
        LabelFlip(fraction=0.3).check(ctx)
