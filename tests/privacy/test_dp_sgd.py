"""Example-level DP-SGD inside every client (lfed.engine.example_dp, lfed.privacy.DPSGD; docs/algorithms.md §17):
each step against a hand computation, against Opacus's GradSampleModule + DPOptimizer (exactly without noise, in
distribution with it), the vmapped cohort against the loop, and each client's ε against dp-accounting's."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import flat_weights, run_rounds
from torch import nn

from lfed.core.algorithm import LocalTraining
from lfed.core.round import run_round
from lfed.data.datasets import load_dataset
from lfed.engine import CohortTrainer, StepRule
from lfed.engine.example_dp import ExampleNoise, clip_and_sum, poisson_schedule
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.models.zoo import MLP
from lfed.privacy import DPSGD
from lfed.rng import round_generator

BACKENDS = ["vmap", "loop"]


def _noise(K: int, clip: float, z: float, B: float, round: int = 0) -> ExampleNoise:
    return ExampleNoise(clip, z, B, [round_generator(0, round, f"dp-sgd/{k}") for k in range(K)])


def test_clip_and_sum_by_hand():
    """Two examples' gradients (3, 4) and (0.3, 0.4) clipped to C = 1: (0.6, 0.8)·(5/(5+1e-6))... and (0.3, 0.4)
    unchanged; a masked example adds nothing."""
    g = {"w": torch.tensor([[3.0, 4.0], [0.3, 0.4], [9.0, 9.0]], dtype=torch.float64)}
    out = clip_and_sum(g, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64), 1.0)["w"]
    first = torch.tensor([3.0, 4.0], dtype=torch.float64) * (1.0 / (5.0 + 1e-6))
    torch.testing.assert_close(out, first + torch.tensor([0.3, 0.4], dtype=torch.float64), atol=1e-15, rtol=0)
    # the norm is over all parameters of the example: (3) and (4) in two tensors have norm 5
    two = clip_and_sum({"a": torch.tensor([[3.0]], dtype=torch.float64), "b": torch.tensor([[4.0]], dtype=torch.float64)},
                       torch.ones(1, dtype=torch.float64), 1.0)
    assert two["a"].item() == pytest.approx(3 / (5 + 1e-6), abs=1e-15)
    assert two["b"].item() == pytest.approx(4 / (5 + 1e-6), abs=1e-15)


def test_the_poisson_schedule_takes_each_example_with_probability_b_over_n():
    n = torch.tensor([40, 10, 4])
    positions, valid = poisson_schedule(n, 4000, 5, torch.Generator().manual_seed(0))
    for k, (size, q) in enumerate([(40, 5 / 40), (10, 0.5), (4, 1.0)]):
        taken = torch.zeros(size)
        for t in range(4000):
            chosen = positions[k, t][valid[k, t]]
            assert chosen.unique().numel() == chosen.numel() and bool((chosen < size).all())  # its own, each once
            taken[chosen] += 1
        rate = taken / 4000
        assert float((rate - q).abs().max()) < 4.5 * math.sqrt(q * (1 - q) / 4000) + 1e-12  # every example at rate q
    sizes = valid.sum(-1).double()
    assert float(sizes[0].mean()) == pytest.approx(5.0, abs=0.15)  # the expected batch is B (a random size)
    assert int(sizes[0].min()) < 5 < int(sizes[0].max())
    assert bool((sizes[2] == 4).all())  # B >= n_k: q = 1, every example every step


def _linear_setting():
    """A linear model with MSE loss on 3 examples of one client: per-example gradients by hand."""
    net = nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[0.5, -1.0]], dtype=torch.float64))
    x = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.1, 0.1]], dtype=torch.float64)
    y = torch.tensor([[1.0], [0.0], [0.05]], dtype=torch.float64)
    return net, x, y


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_dp_sgd_step_by_hand(backend):
    """w = (0.5, -1); ℓ_i = (w·x_i - y_i)², ∇ℓ_i = 2(w·x_i - y_i) x_i: (-5, -10), (9, 0), (-0.02, -0.02) for the three
    examples (residuals -2.5, 1.5, -0.1); clipped to C = 2: (-5, -10)·2/(√125 + 1e-6), (9, 0)·2/(9 + 1e-6), the third as
    is. With the whole
    batch sampled (B = 3 = n: q = 1) and no noise, w ← w - η Σ ḡ_i / B."""
    net, x, y = _linear_setting()
    engine = CohortTrainer(net, loss=nn.MSELoss(reduction="none"), backend=backend)
    w = engine.layout.module_vector(net)
    r = engine.train(w, x, y, torch.arange(3)[None], torch.tensor([3]), torch.tensor([1]),
                     StepRule(example_dp=_noise(1, 2.0, 0.0, 3.0)), 0.1, 3, round_generator(0, 0, "batches"))
    g = (torch.tensor([-5.0, -10.0], dtype=torch.float64) * (2 / (math.sqrt(125) + 1e-6))
         + torch.tensor([9.0, 0.0], dtype=torch.float64) * (2 / (9 + 1e-6)) + torch.tensor([-0.02, -0.02], dtype=torch.float64))
    torch.testing.assert_close(r.weights[0], w - 0.1 * g / 3, atol=1e-14, rtol=0)
    # the loss reported is the batch's mean of the per-example losses: ((-2.5)² + 1.5² + (-0.1)²) / 3
    assert float(r.loss[0]) == pytest.approx((6.25 + 2.25 + 0.01) / 3, abs=1e-12)


def _cohort_setting(K=3):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    X = torch.randn(20 * K, 5, dtype=torch.float64)
    Y = torch.randint(0, 3, (20 * K,))
    return net, X, Y, torch.arange(20 * K).view(K, 20)


@pytest.mark.parametrize("z", [0.0, 1.3])
def test_the_vmapped_cohort_equals_the_loop_with_stragglers_chunks_and_rows(z):
    """Per-example gradients vmapped inside the cohort's vmap equal one backward per example client by client; each
    row's noise is its own stream, so chunking, reordering by steps done, and training rows apart change nothing."""
    net, X, Y, index = _cohort_setting(4)
    n, steps = torch.tensor([20, 15, 20, 7]), torch.tensor([2, 4, 1, 3])  # unsorted steps: the vmap backend reorders

    def train(backend, chunk=None, rows=None):
        engine = CohortTrainer(net, backend=backend, chunk_size=chunk)
        w = engine.layout.module_vector(net)
        return engine.train(w, X, Y, index, n, steps, StepRule(example_dp=_noise(4, 0.5, z, 4.0)), 0.1, 4,
                            round_generator(0, 0, "batches"), rows=rows)

    loop, vm = train("loop"), train("vmap")
    torch.testing.assert_close(vm.weights, loop.weights, atol=1e-14, rtol=0)
    torch.testing.assert_close(vm.loss, loop.loss, atol=1e-14, rtol=0)
    torch.testing.assert_close(train("vmap", chunk=1).weights, vm.weights, atol=1e-14, rtol=0)
    torch.testing.assert_close(train("vmap", rows=torch.tensor([3, 1])).weights, vm.weights[[3, 1]], atol=1e-14, rtol=0)
    if z > 0:  # the noise is there: the noised run differs from the noise-free one
        assert not torch.allclose(vm.weights, train_free(net, X, Y, index, n, steps).weights)


def train_free(net, X, Y, index, n, steps):
    engine = CohortTrainer(net, backend="vmap")
    return engine.train(engine.layout.module_vector(net), X, Y, index, n, steps,
                        StepRule(example_dp=_noise(4, 0.5, 0.0, 4.0)), 0.1, 4, round_generator(0, 0, "batches"))


def _opacus_steps(net, X, Y, batches, lr, clip, z, B, seed=None):
    """Opacus's DP-SGD (GradSampleModule + DPOptimizer, mean reduction, expected batch B) on given batches."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    net = copy.deepcopy(net)  # Opacus hooks its own copy; the caller's net stays as it was
    model = GradSampleModule(net, loss_reduction="mean")
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=lr), noise_multiplier=z, max_grad_norm=clip,
                      expected_batch_size=B, loss_reduction="mean", generator=gen)
    for ids in batches:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X[ids]), Y[ids])
        loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_noise_a_clients_steps_equal_opacus_exactly(backend):
    """One client, 5 steps of Poisson batches (q = 10/30), C = 0.3: lfed's weights equal Opacus's on the same batches
    (Opacus's clip factor min(1, C/(‖g_i‖ + 1e-6)), the sum divided by the expected batch)."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4)).double()
    X, Y = torch.randn(30, 6, dtype=torch.float64), torch.randint(0, 4, (30,))
    engine = CohortTrainer(net, backend=backend)
    w = engine.layout.module_vector(net)
    positions, valid = poisson_schedule(torch.tensor([30]), 5, 10, round_generator(0, 0, "batches"))
    ours = engine.train(w, X, Y, torch.arange(30)[None], torch.tensor([30]), torch.tensor([5]),
                        StepRule(example_dp=_noise(1, 0.3, 0.0, 10.0)), 0.2, 10, round_generator(0, 0, "batches"))
    batches = [positions[0, t][valid[0, t]] for t in range(5)]
    assert all(b.numel() > 0 for b in batches)
    theirs = _opacus_steps(net, X, Y, batches, 0.2, 0.3, 0.0, 10)
    torch.testing.assert_close(ours.weights[0], theirs, atol=1e-13, rtol=0)
    assert not torch.allclose(ours.weights[0], w)  # it trained


def test_with_noise_the_noise_per_coordinate_is_opacus_in_distribution():
    """One step, σ = 1.1, C = 0.5, B = 8 on a 25,000-parameter net: the noised minus the noise-free step, over
    -η σ C / B, has standard deviation 1 for lfed and for Opacus (within 2%: 25,000 draws estimate it to ~0.5%), mean 0,
    and lfed's and Opacus's agree within 2%."""
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(64, 384), nn.ReLU(), nn.Linear(384, 2)).double()
    X, Y = torch.randn(40, 64, dtype=torch.float64), torch.randint(0, 2, (40,))
    lr, clip, z, B = 0.1, 0.5, 1.1, 8
    scale = lr * z * clip / B
    engine = CohortTrainer(net, backend="vmap")
    w = engine.layout.module_vector(net)

    def ours(noise):
        return engine.train(w, X, Y, torch.arange(40)[None], torch.tensor([40]), torch.tensor([1]),
                            StepRule(example_dp=_noise(1, clip, noise, float(B))), lr, B,
                            round_generator(0, 0, "batches")).weights[0]

    lfed_noise = (ours(0.0) - ours(z)) / scale
    positions, valid = poisson_schedule(torch.tensor([40]), 1, B, round_generator(0, 0, "batches"))
    batch = [positions[0, 0][valid[0, 0]]]
    free = _opacus_steps(net, X, Y, batch, lr, clip, 0.0, B)
    noised = _opacus_steps(net, X, Y, batch, lr, clip, z, B, seed=3)
    opacus_noise = (free - noised) / scale
    for draws in (lfed_noise, opacus_noise):
        assert abs(float(draws.std()) - 1) < 0.02
        assert abs(float(draws.mean())) < 0.02
    assert abs(float(lfed_noise.std()) / float(opacus_noise.std()) - 1) < 0.02


def _digits_module(backend="vmap", dp=None, **kwargs):
    torch.manual_seed(0)
    args = dict(fraction=0.5, training={"client_lr": 0.3, "batch_size": 8, "local_steps": 3},
                engine=dict(backend=backend), seed=0)
    args.update(kwargs)
    return FederatedModule(kwargs.pop("net", None) or MLP(64, [16], 10), objective=dp or DPSGD(1.0, 1.0), **args)


def _digits(num_clients=6):
    ds = load_dataset("digits")
    return FederatedDataModule.from_tensors(ds.train_x, ds.train_y, ds.test_x, ds.test_y, num_clients=num_clients,
                                            partition="dirichlet", rho=0.5, seed=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_clients_epsilon_is_dp_accountings_for_its_rate_and_steps(backend):
    """After 3 rounds each client's ε is dp-accounting's RDP ε of S_k steps of PoissonSampled(q_k = B/n_k,
    Gaussian(σ)), S_k its DP-SGD steps over the rounds it trained in; the logged max and median are of those."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    m = _digits_module(backend, DPSGD(noise_multiplier=1.2, clip=1.0, delta=1e-5))
    data = _digits()
    run_rounds(m, data, 3)
    dp = m.objective
    steps, eps = dp.steps, dp.eps
    sizes = m.runs[0].data.client_sizes.cpu()
    assert int((steps > 0).sum()) >= 3 and bool((steps % 3 == 0).all())  # 3 local steps per round trained
    for k in range(steps.numel()):
        if steps[k] == 0:
            assert eps[k] == 0
            continue
        library = rdp_privacy_accountant.RdpAccountant()
        q = min(1.0, 8 / int(sizes[k]))
        library.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.2)), int(steps[k]))
        assert float(eps[k]) == library.get_epsilon(1e-5)
    trained = eps[steps > 0]
    assert m.last_round.extra["privacy/example_epsilon_max"] == float(trained.max())
    assert m.last_round.extra["privacy/example_epsilon_median"] == float(trained.median())


def test_a_round_through_run_round_counts_every_step_a_client_took():
    """run_round on a fixed cohort: each cohort client's S_k grows by its steps done (a straggler's too)."""
    data = _digits(4)
    m = _digits_module()
    run_rounds(m, data, 1)  # builds the run and its state
    dp = m.objective
    before = dp.steps.clone()
    run = m.runs[0]
    w = flat_weights(m)
    _, record = run_round(run.components, w, run.data, run.training_plan, run.engine, round=5, seed=0,
                          clients=torch.tensor([0, 2]), steps_done=torch.tensor([3, 1]))
    after = dp.steps
    assert (after - before).tolist() == [3.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_objective_composes_with_prox_whose_step_is_post_processing(backend):
    """μ > 0: w ← w - η (g̃ + μ (w - w_anchor)) with g̃ the private gradient: equal to the rule applied by hand to the
    μ = 0 run's gradient on one step. The anchor is not the start (w_anchor = w + 1), so the proximal term is not 0
    on the first step; and DPSGD(mu) gives exactly that rule, anchored at the round's broadcast model."""
    from lfed.base.component import Cohort

    net, x, y = _linear_setting()
    engine = CohortTrainer(net, loss=nn.MSELoss(reduction="none"), backend=backend)
    w = engine.layout.module_vector(net)
    free = engine.train(w, x, y, torch.arange(3)[None], torch.tensor([3]), torch.tensor([1]),
                        StepRule(example_dp=_noise(1, 2.0, 0.0, 3.0)), 0.1, 3, round_generator(0, 0, "batches"))
    g = (w - free.weights[0]) / 0.1
    anchor = w + 1.0
    rule = StepRule(decay=0.5, shift=-0.5 * anchor, example_dp=_noise(1, 2.0, 0.0, 3.0))
    prox = engine.train(w, x, y, torch.arange(3)[None], torch.tensor([3]), torch.tensor([1]), rule, 0.1, 3,
                        round_generator(0, 0, "batches"))
    torch.testing.assert_close(prox.weights[0], w - 0.1 * (g + 0.5 * (w - anchor)), atol=1e-15, rtol=0)
    cohort = Cohort(2, torch.tensor([4, 7]), torch.tensor([20, 30]), torch.tensor([2, 2]), torch.tensor([2, 2]), 10,
                    seed=0)
    cohort.plan = LocalTraining(client_lr=0.1, batch_size=5, local_steps=2)
    made = DPSGD(noise_multiplier=1.0, clip=2.0, mu=0.5).step_rule(cohort, anchor, 0.1)
    assert made.decay == 0.5 and torch.equal(made.shift, -0.5 * anchor)
    dp = made.example_dp
    assert (dp.clip, dp.noise_multiplier, dp.expected_batch, len(dp.generators)) == (2.0, 1.0, 5.0, 2)
    assert DPSGD(noise_multiplier=1.0, clip=2.0).step_rule(cohort, anchor, 0.1).decay is None  # mu = 0: plain


@pytest.mark.parametrize("kwargs, match", [
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(clip=0.0), "clip"),
    (dict(delta=1.0), "delta"),
    (dict(accountant="gdp"), "accountant: 'gdp' is not one of"),
    (dict(noise="os"), "noise: 'os' is not one of"),
])
def test_bad_settings_are_refused_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DPSGD(**kwargs)


def _bn_net():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


@pytest.mark.parametrize("settings, match", [
    (dict(training={"client_lr": 0.1, "batch_size": None, "local_steps": 2}), "training.batch_size: example-level DP-SGD"),
    (dict(weighting="dwfed"), "weighting: DWFed's weights come from each client's label counts"),
    (dict(net=_bn_net()), "net: .*BatchNorm"),
])
def test_what_the_accountants_do_not_cover_is_refused_before_round_0(settings, match):
    torch.manual_seed(0)
    net = settings.pop("net", None) or MLP(64, [16], 10)
    args = dict(fraction=0.5, training={"client_lr": 0.3, "batch_size": 8, "local_steps": 3}, seed=0)
    args.update(settings)
    m = FederatedModule(net, objective=DPSGD(1.0, 1.0), **args)
    before = flat_weights(m).clone()
    with pytest.raises(ValueError, match=match):
        run_rounds(m, _digits(), 1)
    assert torch.equal(flat_weights(m), before)


@pytest.mark.parametrize("log_unaccounted", [False, True])
def test_a_dp_sgd_run_logs_only_its_private_metrics_and_the_server_held_test(log_unaccounted):
    """The training loss is read from the clients' data without noise: not logged by default (the gate drops it),
    logged as unaccounted/train/loss with log_unaccounted."""
    m = _digits_module(dp=DPSGD(1.0, 1.0, log_unaccounted=log_unaccounted))
    run_rounds(m, _digits(), 2, evaluate_every=2)
    logged = set(m.trainer.callback_metrics)
    assert {"privacy/example_epsilon_max", "privacy/example_epsilon_median", "test/acc"} <= logged
    assert not any(k.startswith(("train/", "client/", "round/")) for k in logged)
    assert ("unaccounted/train/loss" in logged) == log_unaccounted


def test_resume_continues_each_clients_ledger_exactly(tmp_path):
    """3 rounds, stopped after 2 and resumed, end with the same weights and the same per-client steps and ε."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(rounds, ckpt=None, save=None):
        m = _digits_module()
        cbs = [ModelCheckpoint(dirpath=save, save_last=True, every_n_train_steps=1)] if save else []
        Trainer(max_steps=rounds, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                num_sanity_val_steps=0, check_val_every_n_epoch=None, val_check_interval=rounds, limit_val_batches=0,
                callbacks=cbs, enable_checkpointing=bool(save), precision="64-true"
                ).fit(m, datamodule=_digits(), ckpt_path=ckpt)
        return m

    whole = fit(3)
    fit(2, save=tmp_path)
    resumed = fit(3, ckpt=str(tmp_path / "last.ckpt"))
    assert torch.equal(flat_weights(resumed), flat_weights(whole))
    a, b = whole.objective, resumed.objective
    assert torch.equal(a.steps, b.steps)
    assert torch.equal(a.eps, b.eps)
    # the ledger (who trained, how often) is marked client data in the checkpoint (lfed.privacy.contents)
    marked = torch.load(tmp_path / "last.ckpt", weights_only=False)["lfed"]["client_data"]
    assert {k.rsplit(".", 1)[1] for k in marked if "_extra_state.ledger." in k} == {"steps", "epsilon"}


def test_example_level_and_client_level_dp_compose_each_with_its_own_accountant():
    """objective dp_sgd under the dp_fedavg preset: the clients' steps are DP-SGD and the server clips and noises the
    updates; both ledgers advance (client-level ε per round at q = m/N, example-level per client)."""
    from lfed.privacy import DPFedAvg

    m = _digits_module(algorithm="dp_fedavg", combination=DPFedAvg(noise_multiplier=1.0, clip=0.5))
    run_rounds(m, _digits(), 3)
    extra = m.last_round.extra
    assert m.combination.accountant.rounds == 3 and 0 < extra["privacy/epsilon"] < math.inf
    assert 0 < extra["privacy/example_epsilon_max"] < math.inf
    assert m.objective.name == "dp_sgd"


@pytest.mark.parametrize("backend", BACKENDS)
def test_secure_mode_draws_the_poisson_batches_from_a_secure_source(backend):
    """The accountant's amplification by subsampling assumes nobody can regenerate a step's Poisson sample. With σ = 0
    the round's update depends on its batches alone: two rounds of one seed, round and cohort through run_round are
    equal in seeded mode (the batches from (seed, round, "batches")) and differ in secure mode (a fresh secure sample
    each time; issue 62 item 4: 0.5 drew them from the seeded stream whatever the noise mode)."""
    data = _digits(4)
    for noise, same in (("seeded", True), ("secure", False)):
        m = _digits_module(backend, DPSGD(noise_multiplier=0.0, clip=1.0, noise=noise, delta=1e-5))
        run_rounds(m, data, 1)
        run = m.runs[0]
        w = flat_weights(m)
        outs = [run_round(run.components, w, run.data, run.training_plan, run.engine, round=3, seed=0,
                          clients=torch.tensor([0, 1, 2]), steps_done=torch.tensor([3, 3, 3]))[0] for _ in range(2)]
        assert not torch.equal(outs[0], w)
        assert torch.equal(outs[0], outs[1]) is same, noise
