"""Each attack equals a float64 computation by hand from its paper's equations (docs/robustness.md §1), per round: the
Byzantine rows of one round's updates, the honest rows untouched; the fixed set; label flipping through the engine on
both backends; the refusals before round 0."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
import torch
from robust_helpers import W0, cohort_of, local_update, rows, toy_setup
from test_objectives import BACKENDS, Y

from lfed.base.component import CompositionContext
from lfed.core.algorithm import LocalTraining
from lfed.core.round import run_round
from lfed.rng import round_generator
from lfed.robust.attacks import (
    ALIE,
    IPM,
    Backdoor,
    Gaussian,
    LabelFlip,
    Mimic,
    MinMax,
    MinSum,
    NoAttack,
    Scaling,
    SignFlip,
    alie_z,
    byzantine_set,
    stamp,
)

TOL = dict(atol=1e-12, rtol=0)
D64 = torch.float64
U = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.5, 0.0], [2.0, -1.0, 1.0], [0.5, 0.0, 1.0], [-1.0, 2.0, 1.0],
                  [3.0, 3.0, 3.0], [1.0, 0.0, -2.0]], dtype=D64)
BYZ = [False, False, False, False, False, True, True]  # rows 5 and 6 are Byzantine
HONEST = [0, 1, 2, 3, 4]


def poisoned(attack, updates=U, byzantine=BYZ, counting=None, round=0, seed=0):
    c = cohort_of(updates.shape[0], counting=counting, byzantine=byzantine, round=round, seed=seed)
    return attack.poison(updates.clone(), c)


def honest_mean_std():
    h = rows(U[HONEST])
    mu = [sum(r[c] for r in h) / len(h) for c in range(3)]
    sd = [math.sqrt(sum((r[c] - mu[c]) ** 2 for r in h) / (len(h) - 1)) for c in range(3)]
    return mu, sd


def test_the_byzantine_set_is_fixed_by_the_seed_and_per_round_takes_the_first_rows():
    a = byzantine_set(50, 0.2, seed=4)
    assert int(a.sum()) == 10 and torch.equal(a, byzantine_set(50, 0.2, seed=4))
    assert not torch.equal(a, byzantine_set(50, 0.2, seed=5))
    attack = SignFlip(fraction=0.2)
    c = cohort_of(7)
    c.num_clients, c.seed = 50, 4
    c.clients = c.host.clients = torch.tensor([0, 3, 9, 17, 22, 31, 49])
    attack.start_round(c)
    assert c.host.byzantine.tolist() == a[c.host.clients].tolist() and torch.equal(c.byzantine, c.host.byzantine)
    c2 = cohort_of(7)
    SignFlip(per_round=3).start_round(c2)
    assert c2.host.byzantine.tolist() == [True] * 3 + [False] * 4


def test_sign_flip_scaling_and_gaussian_rewrite_only_the_counting_byzantine_rows():
    out = poisoned(SignFlip(per_round=2))
    torch.testing.assert_close(out[5:], -U[5:], **TOL)
    torch.testing.assert_close(out[:5], U[:5], **TOL)
    out = poisoned(Scaling(per_round=2, scale=-3.5))
    torch.testing.assert_close(out[5:], -3.5 * U[5:], **TOL)
    out = poisoned(Gaussian(per_round=2, std=2.0), round=3, seed=7)
    draw = 2.0 * torch.randn((2, 3), generator=round_generator(7, 3, "attack"), dtype=D64)
    torch.testing.assert_close(out[5:], draw, **TOL)
    torch.testing.assert_close(out[:5], U[:5], **TOL)
    # a Byzantine client whose work does not count (a dropped straggler) is left as it is
    out = poisoned(SignFlip(per_round=2), counting=[True] * 6 + [False])
    torch.testing.assert_close(out[6], U[6], **TOL)
    torch.testing.assert_close(out[5], -U[5], **TOL)
    assert poisoned(NoAttack()) .equal(U)


@pytest.mark.parametrize("n,m", [(7, 2), (10, 1), (10, 2), (25, 5), (50, 12), (5, 4)])
def test_alies_z_is_the_papers_formula(n, m):
    s = max(math.floor(n / 2 + 1) - m, 1)
    assert alie_z(n, m) == pytest.approx(NormalDist().inv_cdf((n - s) / n), abs=1e-12)


def test_alie_sends_the_honest_mean_minus_z_honest_standard_deviations():
    mu, sd = honest_mean_std()
    z = NormalDist().inv_cdf((7 - (math.floor(7 / 2 + 1) - 2)) / 7)
    out = poisoned(ALIE(per_round=2))
    ref = torch.tensor([mu[c] - z * sd[c] for c in range(3)], dtype=D64)
    torch.testing.assert_close(out[5], ref, **TOL)
    torch.testing.assert_close(out[6], ref, **TOL)
    torch.testing.assert_close(out[:5], U[:5], **TOL)
    out = poisoned(ALIE(per_round=2, z=1.5))
    torch.testing.assert_close(out[5], torch.tensor([mu[c] - 1.5 * sd[c] for c in range(3)], dtype=D64), **TOL)


def test_ipm_sends_minus_epsilon_times_the_honest_mean():
    mu, _ = honest_mean_std()
    out = poisoned(IPM(per_round=2, epsilon=0.5))
    torch.testing.assert_close(out[5:], torch.tensor([[-0.5 * v for v in mu]] * 2, dtype=D64), **TOL)


def _search_gamma(ok, gamma=10.0, tol=1e-12):
    """The paper's halving search for the largest γ with ok(γ) (Shejwalkar and Houmansadr 2021, Algorithm 1)."""
    step, best = gamma / 2, 0.0
    while abs(step) > tol:
        if ok(gamma):
            best = gamma
            gamma += step
        else:
            gamma -= step
        step /= 2
    return best


@pytest.mark.parametrize("perturbation", ["std", "unit_vec", "sign"])
def test_min_max_and_min_sum_take_the_largest_gamma_their_constraints_allow(perturbation):
    h = rows(U[HONEST])
    mu, sd = honest_mean_std()
    norm_mu = math.sqrt(sum(v * v for v in mu))
    p = {"std": [-v for v in sd], "unit_vec": [-v / norm_mu for v in mu], "sign": [-math.copysign(1, v) if v else 0.0 for v in mu]}[perturbation]
    dist = lambda a, b: math.sqrt(sum((u - v) ** 2 for u, v in zip(a, b)))  # noqa: E731
    r_max = max(dist(a, b) for a in h for b in h)
    x = lambda g: [m + g * q for m, q in zip(mu, p)]  # noqa: E731
    g_max = _search_gamma(lambda g: max(dist(x(g), b) for b in h) <= r_max)
    out = poisoned(MinMax(per_round=2, perturbation=perturbation))
    torch.testing.assert_close(out[5], torch.tensor(x(g_max), dtype=D64), atol=1e-9, rtol=0)
    assert max(dist(out[5].tolist(), b) for b in h) == pytest.approx(r_max, abs=1e-9)  # the constraint is active
    s_max = max(sum(dist(a, b) ** 2 for b in h) for a in h)
    g_sum = _search_gamma(lambda g: sum(dist(x(g), b) ** 2 for b in h) <= s_max)
    out = poisoned(MinSum(per_round=2, perturbation=perturbation))
    torch.testing.assert_close(out[5], torch.tensor(x(g_sum), dtype=D64), atol=1e-9, rtol=0)


def test_mimic_copies_the_honest_update_farthest_along_the_top_principal_direction():
    h = U[HONEST]
    centered = h - h.mean(0)
    cov = centered.T @ centered  # [P, P]: the principal direction the paper means, computed the long way
    z = torch.linalg.eigh(cov).eigenvectors[:, -1]
    i = int(torch.argmax((centered @ z).abs()))
    out = poisoned(Mimic(per_round=2))
    torch.testing.assert_close(out[5:], U[HONEST][i].expand(2, 3), **TOL)


def _flipped_eigh(monkeypatch):
    """torch.linalg.eigh returning -v for each eigenvector v (as valid a decomposition as +v)."""
    from types import SimpleNamespace

    eigh = torch.linalg.eigh

    def flipped(a):
        r = eigh(a)
        return SimpleNamespace(eigenvalues=r.eigenvalues, eigenvectors=-r.eigenvectors)

    monkeypatch.setattr(torch.linalg, "eigh", flipped)


@pytest.mark.parametrize("flip", [False, True], ids=["eigh's sign", "the opposite sign"])
def test_mimic_copies_the_farthest_honest_update_on_either_side_of_the_mean_whatever_the_eigenvectors_sign(
        monkeypatch, flip):
    # honest rows 0-3: (-3, 1), (-3, -1), (0, 0), (6, 0); μ_H = (0, 0). Σ_i (x_i - μ)(x_i - μ)ᵀ = [[54, 0], [0, 2]], so
    # z = ±(1, 0) and ⟨z, x_i - μ_H⟩ = ±(-3, -3, 0, 6): the farthest along z is row 3, on the side opposite rows 0-1.
    # With the sign of z taken as it comes (argmax of ⟨z, x_i - μ_H⟩, no absolute value), one of the two signs gives
    # row 0, (-3, 1).
    if flip:
        _flipped_eigh(monkeypatch)
    x = torch.tensor([[-3.0, 1.0], [-3.0, -1.0], [0.0, 0.0], [6.0, 0.0], [9.0, 9.0], [9.0, 9.0]], dtype=D64)
    out = poisoned(Mimic(per_round=2), updates=x, byzantine=[False] * 4 + [True] * 2)
    torch.testing.assert_close(out[4:], torch.tensor([[6.0, 0.0]] * 2, dtype=D64), **TOL)
    torch.testing.assert_close(out[:4], x[:4], **TOL)
    # a tie on either side: (-3, 0), (3, 0), (0, 1), (0, -1): ⟨z, x_i - μ_H⟩ = ±(-3, 3, 0, 0); the lower row, 0
    x = torch.tensor([[-3.0, 0.0], [3.0, 0.0], [0.0, 1.0], [0.0, -1.0], [9.0, 9.0], [9.0, 9.0]], dtype=D64)
    out = poisoned(Mimic(per_round=2), updates=x, byzantine=[False] * 4 + [True] * 2)
    torch.testing.assert_close(out[4:], torch.tensor([[-3.0, 0.0]] * 2, dtype=D64), **TOL)


@pytest.mark.parametrize("flip", [False, True], ids=["eigh's sign", "the opposite sign"])
def test_mimic_breaks_a_tie_across_the_mean_by_the_lower_row(monkeypatch, flip):
    # 1-D, honest 4, 3, -4, -3 (μ_H = 0): rows 0 and 2 are both 4 from the mean, on opposite sides: row 0, 4 (the
    # eigenvector's two entries differ by rounding; its largest alone picked row 2, -4)
    if flip:
        _flipped_eigh(monkeypatch)
    x = torch.tensor([[4.0], [3.0], [-4.0], [-3.0], [9.0]], dtype=D64)
    out = poisoned(Mimic(per_round=1), updates=x, byzantine=[False] * 4 + [True])
    assert out[4].tolist() == [4.0]


def test_an_omniscient_attack_with_no_honest_row_uses_the_byzantine_clients_own_updates():
    out = poisoned(IPM(per_round=7, epsilon=1.0), byzantine=[True] * 7)
    torch.testing.assert_close(out[0], -U.mean(0), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_label_flipping_trains_the_byzantine_clients_on_flipped_labels_through_the_engine(backend):
    rows3 = [[0, 1], [2, 3, 4], [5, 6, 7, 8]]  # disjoint clients: a flipped example belongs to one client
    attack = LabelFlip(fraction=0.4)  # round(0.4 * 3) = 1 Byzantine client
    alg, data, engine = toy_setup(backend, rows=rows3, attack=attack)
    byz = byzantine_set(3, 0.4, seed=0)
    assert int(byz.sum()) == 1
    plan = LocalTraining(client_lr=0.1, batch_size=None, local_steps=2)
    w1, rec = run_round(alg, W0.clone(), data, plan, engine, round=0, clients=torch.arange(3), steps_done=torch.full((3,), 2))
    flipped = Y.clone()
    for c in byz.nonzero().flatten().tolist():
        flipped[rows3[c]] = 2 - Y[rows3[c]]  # C = 3 classes: y -> C - 1 - y
    ups = [local_update(W0, rows3[c], 2, 0.1, labels=flipped if byz[c] else None) for c in range(3)]
    sizes = torch.tensor([2.0, 3.0, 4.0], dtype=D64)
    torch.testing.assert_close(w1, W0 + (sizes / sizes.sum()) @ torch.stack(ups), **TOL)
    assert float(rec.metrics()["byzantine/counting"]) == 1
    assert torch.equal(data.train_y, Y)  # the run's data is not changed: the poisoned labels are the attack's copy
    assert rec.cohort.host.byzantine.tolist() == byz.tolist()


def test_the_attacks_settings_are_checked_where_they_are_given():
    with pytest.raises(ValueError, match="fraction: must be a finite number in \\[0, 1\\)"):
        ALIE(fraction=1.0)
    with pytest.raises(ValueError, match="per_round: 2 and fraction: 0.1 both given"):
        ALIE(fraction=0.1, per_round=2)
    with pytest.raises(ValueError, match="per_round: label_flip poisons its clients' training data"):
        LabelFlip(per_round=1)
    with pytest.raises(ValueError, match="perturbation: "):
        MinMax(fraction=0.1, perturbation="up")


def test_the_trigger_is_a_square_in_the_bottom_right_corner_of_each_image():
    x = torch.arange(2 * 16, dtype=D64).reshape(2, 16)  # two flat 4x4 images
    out = stamp(x, 2, -1.0)
    for i in range(2):
        for p in range(16):
            assert out[i, p] == (-1.0 if p in (10, 11, 14, 15) else x[i, p])
    img = torch.zeros(3, 1, 5, 5)
    assert stamp(img, 3, 1.0)[:, :, 2:, 2:].eq(1).all() and stamp(img, 3, 1.0).sum() == 3 * 9
    assert x[0, 15] == 15  # the input is not changed


def _image_data():
    """Three clients of flat 2x2 "images" and a linear model: (rows, data module)."""
    from lfed.lightning.datamodule import FederatedDataModule

    g = torch.Generator().manual_seed(0)
    x = torch.rand(9, 4, generator=g, dtype=D64)
    y = torch.tensor([1, 0, 2, 1, 2, 0, 1, 0, 2])
    dm = FederatedDataModule.from_tensors(x, y, x, y, num_clients=3, partition="iid", holdout_fraction=0.0)
    dm.build()
    rows3 = [[0, 1], [2, 3, 4], [5, 6, 7, 8]]
    dm.data.client_index = torch.tensor([r + [r[0]] * (4 - len(r)) for r in rows3])
    dm.data.client_sizes = torch.tensor([2, 3, 4])
    return rows3, dm, x, y


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backdoor_trains_on_stamped_relabelled_examples_and_boosts_what_it_sends(backend):
    from test_objectives import squared_loss
    from torch import nn

    from lfed.core import registry as algorithms
    from lfed.core.algorithm import setup_state
    from lfed.engine import CohortTrainer
    from lfed.state.spec import ModuleStateStore

    rows3, dm, x, y = _image_data()
    attack = Backdoor(fraction=0.4, target=2, poison_fraction=1.0, trigger_size=1, trigger_value=3.0, boost=2.5)
    net = nn.Linear(4, 1, bias=False).double()
    w0 = torch.tensor([0.1, -0.2, 0.3, 0.05], dtype=D64)
    with torch.no_grad():
        net.weight.copy_(w0[None])
    alg = algorithms.build(algorithms.resolve("fedavg", attack=attack, weighting="uniform"))
    data = dm.build()
    setup_state(alg, ModuleStateStore(), data.client_sizes, 4, w0)
    attack.check(CompositionContext(frozenset(), data=data))
    plan = LocalTraining(client_lr=0.1, batch_size=None, local_steps=2)
    w1, rec = run_round(alg, w0.clone(), data, plan, CohortTrainer(net, squared_loss, backend), clients=torch.arange(3),
                        steps_done=torch.full((3,), 2))
    byz = byzantine_set(3, 0.4, seed=0)
    ups = []
    for c in range(3):
        xc, yc = x[rows3[c]].clone(), y[rows3[c]].double()
        if byz[c]:
            xc[:, 3] = 3.0  # the 1x1 trigger: the last pixel of the 2x2 image
            yc[:] = 2.0
        v = w0.clone()
        for _ in range(2):
            v = v - 0.1 * 2 * xc.T @ (xc @ v - yc) / len(rows3[c])
        ups.append((2.5 if byz[c] else 1.0) * (v - w0))
    torch.testing.assert_close(w1, w0 + sum(ups) / 3, **TOL)
    assert torch.equal(data.train_x, x) and torch.equal(data.train_y, y)  # the run's data is not changed


def test_a_backdoor_stamps_its_share_of_the_byzantine_clients_examples_only_and_scores_its_success():
    rows3, dm, x, y = _image_data()
    data = dm.build()
    attack = Backdoor(fraction=0.7, target=0, poison_fraction=0.5, trigger_size=1, trigger_value=9.0)  # 2 of 3 clients
    attack.check(CompositionContext(frozenset(), data=data))
    c = cohort_of(3)
    px, py = attack.training_data(c, data, data.train_x, data.train_y)
    byz = byzantine_set(3, 0.7, seed=0)
    stamped = (px != x).any(1)
    for k in range(3):
        n = int(stamped[rows3[k]].sum())
        assert n == (math.ceil(0.5 * len(rows3[k])) if byz[k] else 0)
    assert torch.equal(py[stamped], torch.zeros(int(stamped.sum()), dtype=y.dtype)) and torch.equal(py[~stamped], y[~stamped])
    seen = {}

    def evaluate(xt, yt):
        seen["x"], seen["y"] = xt, yt
        return {"test/acc": 0.25}

    assert attack.evaluation_metrics(data, evaluate) == {"backdoor/attack_success": 0.25}
    keep = data.test_y != 0
    torch.testing.assert_close(seen["x"], stamp(data.test_x[keep], 1, 9.0))
    assert seen["y"].eq(0).all() and len(seen["y"]) == int(keep.sum())


@pytest.mark.parametrize("poison_fraction", [0.5, 0.3, 1.0])
def test_each_byzantine_client_stamps_its_own_share_of_its_examples(poison_fraction):
    # 6 clients of 3, 5, 7, 10, 6, 9 flat 2x2 images, 3 Byzantine: client k stamps ⌈poison_fraction · n_k⌉ of its own
    # (0.5: 2, 3, 4, 5, 3, 5; 0.3: 1, 2, 3, 3, 2, 3; 1.0: all), whatever the seed; an honest client none. (Drawn from
    # the Byzantine clients' pooled examples, the shares ranged from 0 to 0.83 at 0.5.)
    from lfed.lightning.datamodule import FederatedDataModule

    sizes = [3, 5, 7, 10, 6, 9]
    n = sum(sizes)
    x = torch.rand(n, 4, generator=torch.Generator().manual_seed(1), dtype=D64)
    y = torch.arange(n) % 3 + 1
    dm = FederatedDataModule.from_tensors(x, y, x, y, num_clients=6, partition="iid", holdout_fraction=0.0)
    data = dm.build()
    starts = [sum(sizes[:k]) for k in range(6)]
    owned = [list(range(s0, s0 + m)) for s0, m in zip(starts, sizes)]
    data.client_index = torch.tensor([r + [r[0]] * (max(sizes) - len(r)) for r in owned])
    data.client_sizes = torch.tensor(sizes)
    expected = {0.5: [2, 3, 4, 5, 3, 5], 0.3: [1, 2, 3, 3, 2, 3], 1.0: sizes}[poison_fraction]
    assert expected == [math.ceil(round(poison_fraction * m, 9)) for m in sizes]
    for seed in range(6):
        attack = Backdoor(fraction=0.5, target=0, poison_fraction=poison_fraction, trigger_size=1, trigger_value=9.0)
        attack.check(CompositionContext(frozenset(), data=data))
        px, py = attack.training_data(cohort_of(6, seed=seed), data, data.train_x, data.train_y)
        byz = byzantine_set(6, 0.5, seed=seed)
        stamped = (px != x).any(1)
        assert int(byz.sum()) == 3
        for k in range(6):
            assert int(stamped[owned[k]].sum()) == (expected[k] if byz[k] else 0), (seed, k)
        assert py[stamped].eq(0).all() and torch.equal(py[~stamped], y[~stamped])


def test_a_backdoor_on_inputs_that_are_not_images_is_refused_naming_the_shapes():
    from test_objectives import toy_data

    with pytest.raises(ValueError, match="attack='backdoor' stamps a square trigger on images, but the inputs are \\(2,\\)"):
        Backdoor(fraction=0.3).check(CompositionContext(frozenset(), data=toy_data().build()))
    with pytest.raises(ValueError, match="target: 5 is not a class of the data"):
        Backdoor(fraction=0.3, target=5).check(CompositionContext(frozenset(), data=_image_data()[1].build()))
