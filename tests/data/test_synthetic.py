"""FedProx's Synthetic(α, β) (lfed/data/synthetic.py; docs/algorithms.md §8.1), by hand on tiny populations.

The statistical checks use a stated tolerance: ``TOL_SIGMA`` standard errors of the estimate (the draws are seeded,
so each check gives the same answer every run; the tolerance says how far off a correct generator can land).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from lfed.data.datasets import DATASETS, NUM_CLASSES, load_dataset
from lfed.data.federated import FederatedDataset, UnusedSettingWarning
from lfed.data.synthetic import (
    CLASSES,
    FEATURES,
    Synthetic,
    client_data,
    client_parameters,
    client_size,
    client_sizes,
    covariance_diagonal,
    labels,
    population,
)
from lfed.rng import derive_seed

TOL_SIGMA = 5.0  # standard errors a statistical check allows


def _normal_sf(t: float) -> float:
    return 0.5 * math.erfc(t / math.sqrt(2))


def test_registered_as_a_dataset():
    assert "synthetic" in DATASETS and NUM_CLASSES["synthetic"] == CLASSES == 10 and FEATURES == 60
    with pytest.raises(ValueError, match="num_clients"):
        load_dataset("synthetic")
    d = load_dataset("synthetic", synthetic=Synthetic(0.5, 0.5, seed=3), num_clients=4)
    assert d.name == "synthetic" and d.num_classes == 10 and d.train_x.shape[1:] == (60,)
    assert d.train_x.dtype == torch.float32 and d.train_y.dtype == torch.long
    assert torch.equal(torch.unique(d.train_groups), torch.arange(4))


def test_sizes_follow_the_reference_formula():
    """n_k = floor(exp(4 + 2 z)) + 50 with z device k's first standard normal from (seed, k) (the reference's
    np.random.lognormal(4, 2).astype(int) + 50); the first floor(0.9 n_k) examples train, the rest test."""
    spec = Synthetic(1.0, 1.0, seed=7)
    for k in range(40):
        g = torch.Generator().manual_seed(derive_seed(7, k, "synthetic/client"))
        z = float(torch.randn(673, generator=g, dtype=torch.float64)[0])
        n = math.floor(math.exp(4 + 2 * z)) + 50
        assert client_size(spec, k) == n
        c = client_data(spec, k)
        assert c.train_x.shape == (int(0.9 * n), 60) and c.test_x.shape == (n - int(0.9 * n), 60)
        assert c.train_y.shape == (int(0.9 * n),) and c.test_y.shape == (n - int(0.9 * n),)
    assert client_size(Synthetic(seed=7), 3) == client_size(Synthetic(0.0, 0.0, iid=True, seed=7), 3)  # α, β: not read


def test_sizes_are_a_shifted_lognormal_4_2():
    """P(n_k - 50 >= m) = P(4 + 2 z >= log m) exactly (the floor keeps it); checked over 2,000 devices at the median
    (m = 55) and one standard deviation up (m = 403), within TOL_SIGMA binomial standard errors."""
    sizes = client_sizes(Synthetic(seed=0), 2000) - 50
    assert int(sizes.min()) >= 0
    for m in (55, 403):
        p = _normal_sf((math.log(m) - 4) / 2)
        seen = float((sizes >= m).double().mean())
        assert abs(seen - p) <= TOL_SIGMA * math.sqrt(p * (1 - p) / 2000), (m, seen, p)


def test_inputs_have_the_clients_mean_and_the_diagonal_covariance():
    """x - v_k pooled over 25 devices (~10,000 examples): per-feature variance j^-1.2 within TOL_SIGMA standard errors
    (relative SE sqrt(2 / n)), correlations between features within TOL_SIGMA / sqrt(n), each device's mean v_k."""
    spec = Synthetic(1.0, 1.0, seed=1)
    residuals = []
    for k in range(25):
        c = client_data(spec, k)
        x = torch.cat([c.train_x, c.test_x]).double()
        assert torch.allclose(x.mean(0), c.v, atol=TOL_SIGMA * math.sqrt(1.0 / x.shape[0]))  # Σ_jj <= 1
        residuals.append(x - c.v)
    r = torch.cat(residuals)
    n = r.shape[0]
    assert n > 5000
    var = (r * r).mean(0)
    want = covariance_diagonal()
    assert torch.allclose(want, torch.arange(1, 61, dtype=torch.float64) ** -1.2)
    assert ((var / want - 1).abs() <= TOL_SIGMA * math.sqrt(2 / n)).all(), (var / want - 1).abs().max()
    corr = torch.corrcoef(r.T)
    off = corr - torch.diag(torch.diag(corr))
    assert off.abs().max() <= TOL_SIGMA / math.sqrt(n)


def test_labels_are_the_argmax_of_the_clients_own_model():
    spec = Synthetic(1.0, 1.0, seed=2)
    other = client_data(spec, 1)
    for k in range(6):
        c = client_data(spec, k)
        for x, y in ((c.train_x, c.train_y), (c.test_x, c.test_y)):
            assert torch.equal(y, torch.argmax(torch.softmax(x.double() @ c.W + c.b, -1), -1))
            assert torch.equal(y, labels(x, c.W, c.b))
        if k != 1:  # another device's model labels these inputs otherwise (α = 1: the models differ)
            assert (labels(c.train_x, other.W, other.b) != c.train_y).double().mean() > 0.2


def test_model_and_input_means_follow_u_and_B():
    """W_k ~ N(u_k, 1), b_k ~ N(u_k, 1) with one u_k, v_k ~ N(B_k, 1): the means of their entries are u_k and B_k
    within TOL_SIGMA standard errors (1/sqrt(600), 1/sqrt(10), 1/sqrt(60)); u_k ~ N(0, α²), B_k ~ N(0, β²) over 400
    devices (the reference's normal(0, alpha): α is the standard deviation)."""
    spec = Synthetic(2.0, 0.5, seed=4)
    us, Bs = [], []
    for k in range(400):
        _, W, b, v, u, B = client_parameters(spec, k)
        if k < 20:
            assert abs(float(W.mean()) - u) <= TOL_SIGMA / math.sqrt(600)
            assert abs(float(b.mean()) - u) <= TOL_SIGMA / math.sqrt(10)
            assert abs(float(v.mean()) - B) <= TOL_SIGMA / math.sqrt(60)
        us.append(u)
        Bs.append(B)
    for values, sd in ((torch.tensor(us), 2.0), (torch.tensor(Bs), 0.5)):
        assert abs(float(values.mean())) <= TOL_SIGMA * sd / math.sqrt(400)
        assert abs(float(values.std()) / sd - 1) <= TOL_SIGMA * math.sqrt(1 / (2 * 399))


def test_alpha_beta_zero_as_the_reference_and_the_iid_variant():
    """Synthetic(0, 0) as the reference's generate_synthetic(alpha=0, beta=0, iid=0): every u_k = B_k = 0, so every
    device draws W_k, b_k, v_k from one law (N(0, 1)), but each its own: the models differ. Synthetic-IID
    (iid=True, the reference's generate_iid.py): one W, b for every device and v_k = 0."""
    zero = Synthetic(0.0, 0.0, seed=5)
    params = [client_parameters(zero, k) for k in range(5)]
    assert all(u == 0.0 and B == 0.0 for *_, u, B in params)
    assert not torch.equal(params[0][1], params[1][1])
    one = Synthetic(1.0, 1.0, seed=5)  # the same draws, shifted by u_k and B_k: α and β scale the devices apart
    for k in range(5):
        _, W, b, v, u, B = client_parameters(one, k)
        assert u != 0.0 and torch.allclose(W - u, params[k][1]) and torch.allclose(b - u, params[k][2])
        assert torch.allclose(v - B, params[k][3])
    iid = Synthetic(iid=True, seed=5)
    shared = [client_data(iid, k) for k in range(5)]
    for c in shared:
        assert torch.equal(c.W, shared[0].W) and torch.equal(c.b, shared[0].b) and torch.equal(c.v, torch.zeros(60))
        assert torch.equal(c.train_y, labels(c.train_x, shared[0].W, shared[0].b))
    assert not torch.equal(shared[0].W, client_data(Synthetic(iid=True, seed=6), 0).W)


def test_each_device_is_a_pure_function_of_seed_and_k():
    """Device k regenerated alone equals itself, and its rows of any population holding it (whatever N); another
    seed gives another device."""
    spec = Synthetic(1.0, 1.0, seed=11)
    a, b = client_data(spec, 3), client_data(spec, 3)
    for x, y in zip(a, b):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))
    assert not torch.equal(client_data(Synthetic(1.0, 1.0, seed=12), 3).W, a.W)
    for n in (4, 7):
        pop = population(spec, n)
        for k in range(n):
            c = client_data(spec, k)
            assert torch.equal(pop.train_x[pop.train_groups == k], c.train_x)
            assert torch.equal(pop.train_y[pop.train_groups == k], c.train_y)
            assert torch.equal(pop.test_x[pop.test_groups == k], c.test_x)
            assert torch.equal(pop.test_y[pop.test_groups == k], c.test_y)
    with pytest.raises(ValueError, match="device id"):
        client_data(spec, -1)


def test_settings_are_checked():
    for kwargs, match in (({"alpha": -1.0}, "alpha"), ({"beta": float("nan")}, "beta"), ({"iid": 1}, "iid"),
                          ({"test_fraction": 1.0}, "test_fraction"), ({"test_fraction": 0.0}, "test_fraction")):
        with pytest.raises(ValueError, match=match):
            Synthetic(**kwargs)
    assert Synthetic(1, 1).name == "synthetic_1_1" and Synthetic(0.5, 0.5).name == "synthetic_0.5_0.5"
    assert Synthetic(iid=True).name == "synthetic_iid"
    c = client_data(Synthetic(seed=0, test_fraction=0.2), 0)  # the paper's text: 80/20
    n = c.train_y.numel() + c.test_y.numel()
    assert c.train_y.numel() == int(0.8 * n)


def test_federated_dataset_one_client_per_device():
    """dataset='synthetic' with partition='natural': client k trains on device k's training share, in order; the
    test set is every device's test share; data.seed is the population's seed."""
    ds = FederatedDataset("synthetic", num_clients=6, partition="natural", holdout_fraction=0.0, seed=9,
                          synthetic_alpha=0.5, synthetic_beta=0.5)
    d = ds.build()
    spec = Synthetic(0.5, 0.5, seed=9)
    assert d.num_clients == 6 and d.num_classes == 10 and "test_from_clients" in d.notes
    for k in range(6):
        c = client_data(spec, k)
        rows = d.client_index[k, :int(d.client_sizes[k])]
        assert torch.equal(d.train_x[rows], c.train_x) and torch.equal(d.train_y[rows], c.train_y)
    assert d.test_y.numel() == sum(client_data(spec, k).test_y.numel() for k in range(6))
    other = FederatedDataset("synthetic", num_clients=6, partition="natural", seed=9, synthetic_alpha=1.0)
    assert ds.dataset_key() != other.dataset_key()  # a grid over α loads each population


def test_federated_dataset_refusals_and_warnings():
    with pytest.raises(ValueError, match="partition: natural"):
        FederatedDataset("synthetic", num_clients=5)
    with pytest.raises(ValueError, match="synthetic_beta"):
        FederatedDataset("synthetic", num_clients=5, partition="natural", synthetic_beta=-0.5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        FederatedDataset("digits", synthetic_alpha=0.5)
    assert any(issubclass(w.category, UnusedSettingWarning) and "synthetic_alpha" in str(w.message) for w in seen)


def test_a_round_runs_on_it():
    """One FedProx round on 5 devices (E = 1) through fit_run: the logistic regression trains on the population."""
    from lfed.client.objectives import Prox
    from lfed.core.fit import fit_run
    from lfed.core.settings import build_run
    from lfed.models import LogisticRegression

    torch.manual_seed(0)
    ds = FederatedDataset("synthetic", num_clients=5, partition="natural", holdout_fraction=0.0)
    run = build_run(algorithm="fedprox", objective=Prox(mu=1.0), net=LogisticRegression(60, 10), fraction=0.4,
                    training={"client_lr": 0.01, "batch_size": 10, "local_epochs": 1}, seed=0)
    history = fit_run(run, ds, 1)
    assert history[-1]["round/clients"] == 2 and math.isfinite(history[-1]["test/loss"])


def test_alpha_moves_no_label():
    """u_k shifts every entry of W_k and b_k by the same scalar, so x W_k + b_k moves by (u_k (Σ_j x_j) + u_k) on every
    class alike: the argmax, the label, is the same whatever α (the same seed and β give the same inputs). α changes
    the devices' models, not their labelling functions (docs/algorithms.md §8.1)."""
    for k in range(30):
        base = client_data(Synthetic(0.0, 1.0, seed=5), k)
        for alpha in (1.0, 3.0):
            c = client_data(Synthetic(alpha, 1.0, seed=5), k)
            assert torch.equal(c.train_x, base.train_x) and torch.equal(c.train_y, base.train_y)
            assert not torch.equal(c.W, base.W)  # the model moved
