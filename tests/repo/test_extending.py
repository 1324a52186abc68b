"""A component in a user's own file (examples/median_combination.py), outside the package, used
directly and through ``lfed fit --config`` with ``class_path`` (docs/extending.md)."""

from __future__ import annotations

import pytest
import torch
import yaml
from conftest import REPO, flat_weights, run_rounds
from test_objectives import BACKENDS, W_INIT, grad, toy_data, toy_module

from lfed.lightning.cli import run_cli


@pytest.fixture
def median(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import median_combination

    return median_combination.CoordinateMedian


def test_the_median_by_hand(median):
    from lfed.base.component import Cohort

    updates = torch.tensor([[1.0, -2.0], [5.0, 0.0], [3.0, 7.0], [100.0, 100.0]])
    cohort = Cohort(0, torch.arange(4), torch.ones(4), torch.ones(4), torch.ones(4), 4)
    cohort.counting = torch.tensor([True, True, True, False])  # the outlier's work does not count
    delta, _ = median().combine(updates, torch.full((4,), 0.25), cohort)
    assert delta.tolist() == [3.0, 0.0]
    cohort.counting = torch.tensor([True, True, True, True])  # even: mean of the two middle values
    assert median().combine(updates, torch.full((4,), 0.25), cohort)[0].tolist() == [4.0, 3.5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_median_in_a_round_by_hand(median, backend):
    m = toy_module("plain", backend, combination=median(), training=dict(client_lr=0.1, local_steps=2))
    run_rounds(m, toy_data(), rounds=1)
    deltas = []
    for k in range(3):
        y = W_INIT.clone()
        for _ in range(2):
            y = y - 0.1 * grad(y, k)
        deltas.append(y - W_INIT)
    expected = W_INIT + torch.stack(deltas).median(dim=0).values  # three clients: the middle one
    torch.testing.assert_close(flat_weights(m), expected, atol=1e-13, rtol=0)
    assert m.composition["combination"] == "median"


def test_a_users_component_through_the_cli_with_class_path(median, tmp_path):
    cfg = tmp_path / "median.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"combination": {"class_path": "median_combination.CoordinateMedian"}}}))
    cli = run_cli(["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--config", str(cfg),
                   "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.logger=false",
                   "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"])
    assert type(cli.model.combination) is median and cli.trainer.global_step == 2
    assert torch.isfinite(flat_weights(cli.model)).all()


# ----------------------------------------------------------------------------- the extension points, used as a
# user's files would use them (examples/ditto.py, moon.py, qffl.py, fednova.py; docs/extending.md)


@pytest.fixture
def examples(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import ditto
    import fednova
    import moon
    import qffl

    return {"Ditto": ditto.Ditto, "MOON": moon.MOON, "QFedAvg": qffl.QFedAvg, "FedNova": fednova.FedNova}


SIZES = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)  # the toy clients' n_k


def gd(w, k, steps, lr=0.1, extra=lambda w: 0.0):
    for _ in range(steps):
        w = w - lr * (grad(w, k) + extra(w))
    return w


@pytest.mark.parametrize("backend", BACKENDS)
def test_ditto_personal_models_two_rounds_by_hand(examples, backend):
    """Per-client state that starts as the global model, and a second training of the cohort from per-client
    start weights with its own step rule (LocalWork.train): v_k ← v_k − η(∇F_k(v_k) + λ(v_k − w^t))."""
    lam = 0.5
    m = toy_module(examples["Ditto"](lam=lam), backend)
    run_rounds(m, toy_data(), rounds=2)
    w, v = W_INIT.clone(), [W_INIT.clone() for _ in range(3)]
    for _ in range(2):
        ends = [gd(w, k, 2) for k in range(3)]
        v = [gd(v[k], k, 2, extra=lambda p, w=w: lam * (p - w)) for k in range(3)]
        w = sum(SIZES[k] / SIZES.sum() * ends[k] for k in range(3))
    torch.testing.assert_close(flat_weights(m), w, atol=1e-13, rtol=0)  # the global model: FedAvg's
    personal = m.objective.rows("personal", torch.arange(3), first=torch.full((2,), float("nan"), dtype=torch.float64))
    torch.testing.assert_close(personal, torch.stack(v), atol=1e-13, rtol=0)
    with pytest.raises(ValueError, match="starts as the global model.*first=w"):
        m.objective.rows("personal", torch.arange(3))


def test_state_that_starts_as_the_global_model_reads_first_until_written(examples):
    m = toy_module(examples["Ditto"](lam=0.5), "vmap", fraction=1 / 3)
    run_rounds(m, toy_data(), rounds=1)
    [taken] = m.last_round.cohort.clients.tolist()
    first = torch.tensor([7.0, 8.0], dtype=torch.float64)
    rows = m.objective.rows("personal", torch.arange(3), first=first)
    assert all(torch.equal(rows[k], first) for k in range(3) if k != taken)  # never took part: the given model
    assert not torch.equal(rows[taken], first)


def moon_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).double()


def ce(out, y):
    return torch.nn.functional.cross_entropy(out, y, reduction="none")


@pytest.mark.parametrize("backend", BACKENDS)
def test_moon_reads_a_representation_and_runs_the_net_with_other_rows_two_rounds_by_hand(examples, backend):
    """A loss term that reads the penultimate representation (layer "1") of the model it trains and runs the same
    net with the global model's and the client's previous model's rows: MOON's ℓ_con, checked against the formula
    written out with autograd over two rounds (round 0: z_prev = z_glob, so it is FedAvg's round)."""
    from torch.func import functional_call

    mu, tau, lr = 0.7, 0.5, 0.1
    net = moon_net()
    names = [n for n, _ in net.named_parameters()]
    shapes = [p.shape for _, p in net.named_parameters()]
    w0 = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    m = FederatedModuleFor(net, examples["MOON"](mu=mu, temperature=tau, layer="1"), backend, lr)
    run_rounds(m, toy_data(), rounds=2)

    def params(w):
        return dict(zip(names, [c.reshape(s) for c, s in zip(w.split([s.numel() for s in shapes]), shapes)]))

    def rep(w, x):
        return torch.tanh(x @ params(w)["0.weight"].T + params(w)["0.bias"])  # layer "1": Tanh(Linear(x))

    def loss(w, k, w_glob, w_prev):
        from test_objectives import CLIENT_ROWS, X, Y

        x, y = X[CLIENT_ROWS[k]], Y[CLIENT_ROWS[k]]
        z = rep(w, x)
        pos = torch.nn.functional.cosine_similarity(z, rep(w_glob, x), dim=-1) / tau
        neg = torch.nn.functional.cosine_similarity(z, rep(w_prev, x), dim=-1) / tau
        return (ce(functional_call(net, params(w), (x,)), y) + mu * (torch.logaddexp(pos, neg) - pos)).mean()

    w, prev = w0.clone(), [w0.clone() for _ in range(3)]
    for _ in range(2):
        ends = []
        for k in range(3):
            y = w.clone()
            for _ in range(2):
                y_ = y.clone().requires_grad_(True)
                (g,) = torch.autograd.grad(loss(y_, k, w, prev[k]), y_)
                y = y - lr * g
            ends.append(y)
        prev = ends
        w = sum(SIZES[k] / SIZES.sum() * ends[k] for k in range(3))
    torch.testing.assert_close(flat_weights(m), w, atol=1e-12, rtol=0)
    plain = FederatedModuleFor(moon_net(), examples["MOON"](mu=0.0, layer="1"), backend, lr)
    run_rounds(plain, toy_data(), rounds=2)
    assert not torch.allclose(flat_weights(plain), w, atol=1e-6)  # the term changed the run


def FederatedModuleFor(net, objective, backend, lr):
    from lfed.lightning.module import FederatedModule

    return FederatedModule(net, objective=objective, loss=ce, fraction=1.0, training=dict(client_lr=lr, batch_size=None, local_steps=2),
                           engine=dict(backend=backend), seed=3)


def test_a_loss_term_naming_no_submodule_is_refused_naming_the_layers(examples):
    m = FederatedModuleFor(moon_net(), examples["MOON"](layer="head"), "vmap", 0.1)
    with pytest.raises(ValueError, match="layer 'head' is not a submodule of the net; its submodules: \\['0', '1', '2'\\]"):
        run_rounds(m, toy_data(), rounds=2)


def test_qfedavg_reads_each_clients_loss_under_the_rounds_model_by_hand(examples):
    """A component that asks for F_k(w^t) (needs_start_loss): q-FedAvg's Algorithm 2 over one round."""
    from test_objectives import CLIENT_ROWS, X, Y

    q, L = 2.0, 10.0
    m = toy_module("plain", "vmap", combination=examples["QFedAvg"](q=q, lipschitz=L))
    run_rounds(m, toy_data(), rounds=1)
    F = torch.stack([((X[r] @ W_INIT - Y[r].double()) ** 2).mean() for r in CLIENT_ROWS])
    torch.testing.assert_close(m.last_round.cohort.start_loss, F, atol=1e-14, rtol=0)
    dw = [L * (W_INIT - gd(W_INIT, k, 2)) for k in range(3)]
    num = sum(F[k] ** q * dw[k] for k in range(3))
    den = sum(q * F[k] ** (q - 1) * dw[k].square().sum() + L * F[k] ** q for k in range(3))
    torch.testing.assert_close(flat_weights(m), W_INIT - num / den, atol=1e-13, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fednova_normalises_by_each_clients_steps_by_hand(examples, backend):
    m = toy_module("plain", backend, combination=examples["FedNova"](), stragglers=dict(p_incomplete=0.6), training=dict(local_steps=4))
    run_rounds(m, toy_data(), rounds=1)
    rec = m.last_round
    tau = rec.cohort.steps_done.double()
    assert len(set(tau.tolist())) > 1  # stragglers: the steps differ
    p = rec.weights / rec.weights.sum()
    u = [gd(W_INIT, k, int(tau[i])) - W_INIT for i, k in enumerate(rec.cohort.clients.tolist())]
    expected = W_INIT + (p * tau).sum() * sum(p[i] / tau[i] * u[i] for i in range(3) if tau[i] > 0)
    torch.testing.assert_close(flat_weights(m), expected, atol=1e-13, rtol=0)


@pytest.mark.parametrize("name", ["MOON"])  # examples/ditto.py is lfed's own Ditto now (lfed.personal.ditto)
def test_the_start_up_line_and_the_run_directory_name_the_composition(examples, name, tmp_path):
    spec = {"Ditto": {"class_path": "ditto.Ditto", "init_args": {"lam": 0.1}},
            "MOON": {"class_path": "moon.MOON", "init_args": {"layer": "net.3"}}}[name]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"objective": spec}}))
    cli = run_cli(["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--config", str(cfg),
                   "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.logger=false",
                   "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"])
    assert cli.trainer.global_step == 2 and torch.isfinite(flat_weights(cli.model)).all()
    assert cli.model.label == f"fedavg+{name}"
    assert [p.name.startswith(f"fedavg+{name}-digits-") for p in (tmp_path / "runs").iterdir()] == [True]
