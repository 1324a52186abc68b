"""Client-level differential privacy (lfed.privacy, SPEC §10): clipping, noise, the fixed denominator, adaptive
clipping, the accountant, exact resume and FedAvg as the noiseless limit, each against a hand computation."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import flat_weights, run_rounds

from lfed.base.component import Cohort, standalone_store
from lfed.base.declaration import declaration
from lfed.data.datasets import load_dataset
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.models.zoo import MLP
from lfed.privacy import DPFedAvg, PrivacyAccountant, clip_rows
from lfed.privacy.accountant import calibrate_noise, epsilon

BACKENDS = ["vmap", "loop"]


def test_clip_rows_by_hand():
    updates = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]], dtype=torch.float64)
    clipped, norms = clip_rows(updates, 1.0)
    assert norms.tolist() == [5.0, 0.5, 0.0]
    torch.testing.assert_close(clipped, torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]], dtype=torch.float64),
                               atol=1e-15, rtol=0)  # above C scaled to norm C, below and zero unchanged
    assert torch.equal(clip_rows(updates, math.inf)[0], updates)


def _dp(P: int, N: int = 10, **kwargs) -> DPFedAvg:
    dp = DPFedAvg(**kwargs)
    dp.delta = 1e-5
    dp.setup_state(standalone_store(), torch.ones(N), P, torch.zeros(1, dtype=torch.float64))
    dp.update_multiplier = dp._update_multiplier()
    return dp


def _cohort(r: int, K: int, m: float, N: int = 10, counting=None) -> Cohort:
    c = Cohort(r, torch.arange(K), torch.ones(K), torch.ones(K), torch.ones(K), N, expected_size=m, seed=7)
    c.counting = torch.ones(K, dtype=torch.bool) if counting is None else torch.tensor(counting)
    return c


def test_the_fixed_denominator_by_hand():
    """z = 0: Δ = Σ clip(Δ_k) / m with m the expected cohort (4), not the 3 that took part; a non-counting row adds 0."""
    dp = _dp(2, noise_multiplier=0.0, clip=1.0)
    updates = torch.tensor([[3.0, 4.0], [0.3, 0.4], [-0.5, 0.0], [100.0, 100.0]], dtype=torch.float64)
    delta, _ = dp.combine(updates, torch.full((4,), 0.25), _cohort(0, 4, 4.0, counting=[True, True, True, False]))
    expected = torch.tensor([0.6 + 0.3 - 0.5, 0.8 + 0.4 + 0.0], dtype=torch.float64) / 4
    torch.testing.assert_close(delta, expected, atol=1e-15, rtol=0)


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_noise_has_standard_deviation_z_c_over_m(adaptive):
    """Zero updates: Δ·m/C is the noise; its standard deviation is z, or z_Δ = (z⁻² - (2σ_b)⁻²)^(-1/2) when the
    count query of adaptive clipping takes its share (a 10% error in the scale fails the bound)."""
    z, C, m, P = 1.3, 0.5, 4.0, 20000
    extra = dict(target_quantile=0.5, count_noise=1.0, clip_lr=1e-12) if adaptive else {}  # C stays 0.5 to 1e-12
    want = (z ** -2 - 2.0 ** -2) ** -0.5 if adaptive else z
    dp = _dp(P, noise_multiplier=z, clip=C, **extra)
    draws = torch.cat([dp.combine(torch.zeros(3, P, dtype=torch.float64), None, _cohort(r, 3, m))[0] for r in range(3)])
    scaled = draws * m / C
    assert abs(float(scaled.std()) / want - 1) < 0.03  # 60,000 draws: the estimate's error is ~0.3%
    assert abs(float(scaled.mean())) < 0.05
    again = _dp(P, noise_multiplier=z, clip=C, **extra).combine(torch.zeros(3, P, dtype=torch.float64), None, _cohort(0, 3, m))[0]
    assert torch.equal(again, draws[:P])  # a seeded stream: (seed, round) gives the same noise on every rank


def _pairwise_correlations(draws: torch.Tensor) -> list[float]:
    """The Pearson correlation of every pair of rows of ``draws``."""
    c = torch.corrcoef(draws)
    i, j = torch.triu_indices(len(draws), len(draws), offset=1)
    return c[i, j].tolist()


def test_the_noise_is_fresh_every_round_and_for_every_seed():
    """Zero updates: Δ is pure noise N(0, (zC/m)² I). Rounds 0-3 under seed 7 and under seed 8 give 8 draws of
    P = 20,000: every pair is uncorrelated (independent draws give ρ with standard deviation 1/√P ≈ 0.007, so
    |ρ| < 0.05 is 7 of them, false alarm < 1e-11 a pair; noise reused across rounds or seeds gives ρ = 1), and each
    draw's standard deviation is zC/m within 5% (its estimate's error is 1/√(2P) = 0.5%)."""
    z, C, m, P = 1.3, 0.5, 4.0, 20000
    dp = _dp(P, noise_multiplier=z, clip=C)
    draws = []
    for seed in (7, 8):
        for r in range(4):
            cohort = _cohort(r, 3, m)
            cohort.seed = seed
            draws.append(dp.combine(torch.zeros(3, P, dtype=torch.float64), None, cohort)[0])
    draws = torch.stack(draws)
    assert max(abs(rho) for rho in _pairwise_correlations(draws)) < 0.05
    for d in draws:
        assert abs(float(d.std()) / (z * C / m) - 1) < 0.05


@pytest.mark.parametrize("local", [False, True])
def test_a_runs_aggregates_are_fresh_noise_every_round_and_for_every_seed(local):
    """End to end (sampling, training, the round's seed and counter, the server step): with client_lr = 1e-12 the
    clients' updates are ~1e-12 and each round's change of the global model is its noise, std zC/m (server, q = 1:
    m = N = 10) or σ_l C/√m (local DP: the mean of m clients' own noise). 4 rounds under seeds 0 and 1: every pair
    of the 8 changes is uncorrelated (P = 1,210: ρ's standard deviation 1/√P ≈ 0.029, |ρ| < 0.2 is 7 of them; reused
    noise gives ρ = 1), each with that standard deviation within 15% (its estimate's error 1/√(2P) ≈ 2%)."""
    from lightning.pytorch import Callback

    changes = []

    class Changes(Callback):
        def on_train_batch_start(self, trainer, module, *args):
            self.before = flat_weights(module).clone()

        def on_train_batch_end(self, trainer, module, *args):
            changes.append(flat_weights(module) - self.before)

    z, C, N = 1.0, 0.5, 10
    settings = dict(noise_multiplier=0.0, local_noise=z) if local else dict(noise_multiplier=z)
    for seed in (0, 1):
        m = _module(algorithm="dp_fedavg", fraction=1.0, training=dict(client_lr=1e-12), seed=seed,
                    combination=DPFedAvg(clip=C, **settings))
        run_rounds(m, _digits(N), 4, callbacks=[Changes()])
    draws = torch.stack(changes)
    assert draws.shape == (8, 1210)
    assert max(abs(rho) for rho in _pairwise_correlations(draws)) < 0.2
    want = z * C / N ** 0.5 if local else z * C / N
    for d in draws:
        assert abs(float(d.std()) / want - 1) < 0.15


def test_adaptive_clipping_three_rounds_by_hand():
    """C_{t+1} = C_t exp(-η_C (b̄ - γ)), b̄ = (number of counting clients with ‖Δ_k‖ ≤ C_t) / m (count noise 0)."""
    dp = _dp(2, noise_multiplier=0.0, clip=1.0, target_quantile=0.5, clip_lr=0.2, count_noise=0.0)
    norms = [[0.5, 2.0, 3.0], [0.5, 0.6, 3.0], [0.1, 0.2, 0.3]]
    C, m = 1.0, 3.0
    for r, row in enumerate(norms):
        updates = torch.tensor([[n, 0.0] for n in row], dtype=torch.float64)
        dp.combine(updates, None, _cohort(r, 3, m))
        b = sum(n <= C for n in row) / m
        C = C * math.exp(-0.2 * (b - 0.5))
        assert float(dp.state("clip")) == pytest.approx(C, rel=1e-15, abs=0)
    assert dp.report(None)["privacy/clip_next"] == pytest.approx(C, rel=1e-15)


def test_adaptive_clipping_splits_the_noise_multiplier():
    dp = _dp(2, noise_multiplier=1.0, clip=1.0, target_quantile=0.5, count_noise=1.0)
    assert dp.update_multiplier == pytest.approx((1 - 1 / 4) ** -0.5, rel=1e-15)  # (z⁻² - (2σ_b)⁻²)^(-1/2)
    with pytest.raises(ValueError, match="count_noise: adaptive clipping needs 2·count_noise > noise_multiplier"):
        _dp(2, noise_multiplier=1.0, clip=1.0, target_quantile=0.5, count_noise=0.5)


def _digits(num_clients: int = 10) -> FederatedDataModule:
    ds = load_dataset("digits")
    return FederatedDataModule.from_tensors(ds.train_x, ds.train_y, ds.test_x, ds.test_y, num_clients=num_clients,
                                            partition="dirichlet", rho=0.5, seed=0)


def _module(backend: str = "vmap", *, training: dict | None = None, **kwargs) -> FederatedModule:
    """``training`` is merged over the defaults (client_lr=0.05, batch_size=10, 3 local steps)."""
    torch.manual_seed(0)
    args = dict(fraction=1.0, training={"client_lr": 0.05, "batch_size": 10, "local_steps": 3, **(training or {})},
                engine=dict(backend=backend), seed=0)
    args.update(kwargs)
    net = args.pop("net", None)
    return FederatedModule(MLP(64, [16], 10) if net is None else net, **args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_noise_and_no_clip_is_fedavg_with_uniform_weights_bit_for_bit(backend):
    dp = _module(backend, algorithm="dp_fedavg", combination=DPFedAvg(noise_multiplier=0.0, clip=math.inf))
    with pytest.warns(UserWarning, match="gives no privacy"):
        run_rounds(dp, _digits(), 3)
    plain = _module(backend, algorithm="fedavg", weighting="uniform")
    run_rounds(plain, _digits(), 3)
    assert torch.equal(flat_weights(dp), flat_weights(plain))


def test_poisson_cohorts_run_eagerly_and_fixed_cohorts_are_recorded():
    """A Poisson cohort has a new size almost every round: the engine does not record one graph per size."""
    poisson = _module(algorithm="dp_fedavg", fraction=0.5, combination=DPFedAvg(noise_multiplier=1.0, clip=0.5))
    run_rounds(poisson, _digits(), 2)
    fixed = _module(algorithm="fedavg", fraction=0.5)
    run_rounds(fixed, _digits(), 2)
    assert poisson.engine.trace is False and poisson.engine._traced == {}
    assert fixed.engine.trace is True and any(g is not None for g in fixed.engine._traced.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_epsilon_after_t_rounds_is_the_librarys_and_opacus_agrees(backend):
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    z, q, T, N = 1.1, 0.3, 5, 10
    m = _module(backend, algorithm="dp_fedavg", fraction=q, combination=DPFedAvg(noise_multiplier=z, clip=0.5))
    run_rounds(m, _digits(N), T)
    delta = 1 / N ** 1.1
    library = rdp_privacy_accountant.RdpAccountant()
    library.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), T)
    assert m.last_round.extra["privacy/epsilon"] == library.get_epsilon(delta)
    assert m.combination.accountant.rounds == T
    from opacus.accountants import RDPAccountant

    opacus = RDPAccountant()
    for _ in range(T):
        opacus.step(noise_multiplier=z, sample_rate=q)
    assert m.last_round.extra["privacy/epsilon"] == pytest.approx(opacus.get_epsilon(delta), rel=0.01)


def test_rounds_with_no_client_still_release_their_noise():
    """Poisson sampling at q = 0.1 of 10 clients: some rounds draw nobody; they still add noise (never skipped)."""
    m = _module(algorithm="dp_fedavg", fraction=0.1, combination=DPFedAvg(noise_multiplier=1.0, clip=0.5))
    sizes = []

    class Sizes(__import__("lightning.pytorch").pytorch.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            sizes.append((module.last_round.cohort.clients.numel(), module.last_round.skipped))

    before = flat_weights(m).clone()
    run_rounds(m, _digits(), 8, callbacks=[Sizes()])
    assert any(k == 0 for k, _ in sizes) and not any(skipped for _, skipped in sizes)
    assert m.combination.accountant.rounds == 8 and not torch.equal(flat_weights(m), before)


def test_resume_restores_the_accountant_exactly(tmp_path):
    from lightning.pytorch import Trainer

    from lfed.state.fingerprint import ResumeWarning

    def fit(rounds, ckpt=None):
        m = _module(algorithm="dp_fedavg", fraction=0.3,
                    combination=DPFedAvg(noise_multiplier=1.0, clip=0.5, target_quantile=0.5, count_noise=1.0))
        t = Trainer(max_steps=rounds, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                    enable_checkpointing=False, num_sanity_val_steps=0, precision="64-true", limit_val_batches=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResumeWarning)  # the same settings: an exact continuation, no warning
            t.fit(m, datamodule=_digits(), ckpt_path=ckpt)
        return m, t

    whole, _ = fit(4)
    half, t = fit(2)
    t.save_checkpoint(tmp_path / "r2.ckpt")
    resumed, _ = fit(4, tmp_path / "r2.ckpt")
    assert torch.equal(flat_weights(resumed), flat_weights(whole))
    assert resumed.combination.accountant.state_dict() == whole.combination.accountant.state_dict()
    assert resumed.last_round.extra["privacy/epsilon"] == whole.last_round.extra["privacy/epsilon"]
    assert float(resumed.combination.state("clip")) == float(whole.combination.state("clip"))


def test_local_dp_is_accounted_under_the_zero_out_relation():
    """docs/privacy.md: local DP's ε is for zero-out neighbours. With the same noise (one seed and round), a client's
    upload with a large update and with its update zeroed differ by its clipped update, norm C (/m in Δ); replaced by
    the opposite update they differ by 2C (replace-one). The accountant composes GaussianDpEvent(σ_l), the event at
    sensitivity C, once a round (q = 1), not GaussianDpEvent(σ_l / 2), replace-one's (a larger ε)."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    sigma, C, m, P = 1.5, 0.5, 4.0, 50
    v = torch.linspace(-3.0, 5.0, P, dtype=torch.float64)
    others = torch.randn(2, P, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def upload(first):
        dp = _dp(P, noise_multiplier=0.0, local_noise=sigma, clip=C)
        delta = dp.combine(torch.cat([first[None], others]), None, _cohort(0, 3, m))[0]
        return delta, dp

    with_v, dp = upload(v)
    zeroed, _ = upload(torch.zeros(P, dtype=torch.float64))
    opposite, _ = upload(-v)
    assert float(torch.linalg.vector_norm(with_v - zeroed)) * m == pytest.approx(C, rel=1e-12)
    assert float(torch.linalg.vector_norm(with_v - opposite)) * m == pytest.approx(2 * C, rel=1e-12)
    assert dp.accountant.events == {(1.0, sigma): 1}
    T, delta = 5, 1e-5
    for _ in range(T - 1):
        dp.accountant.step(1.0, sigma)

    def library(noise):
        a = rdp_privacy_accountant.RdpAccountant()
        a.compose(dp_accounting.GaussianDpEvent(noise), T)
        return a.get_epsilon(delta)

    assert dp.accountant.epsilon(delta) == pytest.approx(library(sigma), rel=1e-6)
    assert library(sigma / 2) > 1.5 * dp.accountant.epsilon(delta)  # replace-one's ε: not what lfed reports


def _fit_dp(rounds, ckpt=None, stop_after=None, dp=None, **dp_settings):
    """A DP run of ``rounds`` planned rounds on 100 digits clients (stopped after ``stop_after``), its trainer and the
    ResumeWarnings it gave."""
    from lightning.pytorch import Callback, Trainer

    from lfed.state.fingerprint import ResumeWarning

    class StopAfter(Callback):
        def on_train_batch_end(self, trainer, *args):
            if stop_after is not None and trainer.global_step >= stop_after:
                trainer.should_stop = True

    m = _module(algorithm="dp_fedavg", fraction=0.5, combination=dp or DPFedAvg(**dp_settings))
    t = Trainer(max_steps=rounds, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                enable_checkpointing=False, num_sanity_val_steps=0, precision="64-true", limit_val_batches=0,
                callbacks=[StopAfter()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(m, datamodule=_digits(100), ckpt_path=ckpt)
    return m, t, [str(w.message) for w in caught if issubclass(w.category, ResumeWarning)]


#: Every DP setting left for the check to resolve: δ = 1/N^1.1, z calibrated, count_noise = m/20.
RESOLVED = dict(noise_multiplier=None, target_epsilon=8.0, clip=0.5, target_quantile=0.5)


def test_a_resumed_dp_run_with_resolved_settings_is_exact_and_gives_no_resume_warning(tmp_path):
    """Default δ, a calibrated z and adaptive clipping with the default count noise: the checkpoint holds the resolved
    values, the resuming run has not resolved them yet; the fingerprint compares the settings as given."""
    whole, _, _ = _fit_dp(4, **RESOLVED)
    half, t, _ = _fit_dp(4, stop_after=2, **RESOLVED)
    assert t.global_step == 2 and half.combination.delta == 1 / 100 ** 1.1 and half.combination.count_noise == 50 / 20
    t.save_checkpoint(tmp_path / "r2.ckpt")
    resumed, t, warned = _fit_dp(4, tmp_path / "r2.ckpt", **RESOLVED)
    assert warned == [] and t.global_step == 4
    assert torch.equal(flat_weights(resumed), flat_weights(whole))
    assert resumed.combination.accountant.state_dict() == whole.combination.accountant.state_dict()
    assert resumed.combination.noise_multiplier == whole.combination.noise_multiplier
    assert resumed.last_round.extra["privacy/epsilon"] == whole.last_round.extra["privacy/epsilon"] <= 8.0
    assert float(resumed.combination.state("clip")) == float(whole.combination.state("clip"))
    # a setting really changed still warns, naming it; so do other rounds, for which z is calibrated anew
    _, _, warned = _fit_dp(4, tmp_path / "r2.ckpt", **{**RESOLVED, "clip_lr": 0.1})
    assert len(warned) == 1 and "combination.clip_lr: 0.2 -> 0.1" in warned[0]
    _, _, warned = _fit_dp(4, tmp_path / "r2.ckpt", **{**RESOLVED, "delta": 1e-3})
    assert len(warned) == 1 and "combination.delta: None -> 0.001" in warned[0]
    _, _, warned = _fit_dp(5, tmp_path / "r2.ckpt", **RESOLVED)
    assert len(warned) == 1 and "total_rounds (trainer.max_steps; combination depends on it): 4 -> 5" in warned[0]


def test_calibration_finds_the_smallest_noise_for_a_budget():
    z = calibrate_noise(4.0, 1e-5, [0.1] * 100)
    assert epsilon({(0.1, z): 100}, 1e-5) <= 4.0 < epsilon({(0.1, z * 0.99): 100}, 1e-5)
    m = _module(algorithm="dp_fedavg", fraction=0.3, combination=DPFedAvg(noise_multiplier=None, target_epsilon=8.0, clip=0.5))
    run_rounds(m, _digits(), 3)
    assert m.last_round.extra["privacy/epsilon"] <= 8.0
    assert m.combination.noise_multiplier == pytest.approx(calibrate_noise(8.0, 1 / 10 ** 1.1, [0.3] * 3), rel=1e-12)


def test_the_accountant_state_round_trips():
    a = PrivacyAccountant()
    for _ in range(3):
        a.step(0.1, 1.0)
    a.step(0.2, 1.0)
    b = PrivacyAccountant()
    b.load_state_dict(a.state_dict())
    assert b.events == a.events and b.epsilon(1e-5) == a.epsilon(1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(noise_multiplier=-1.0), "noise_multiplier: must be a finite number >= 0"),
    (dict(clip=0.0), r"clip: must be a finite number > 0 or inf \(no clipping\), got 0.0"),
    (dict(clip=-math.inf), r"clip: must be a finite number > 0 or inf"),
    (dict(delta=1.0), r"delta: must be a finite number in \(0, 1\), got 1.0"),
    (dict(noise_multiplier=None), "give a noise multiplier z >= 0, or target_epsilon"),
    (dict(clip=math.inf), "infinite clip"),
    (dict(noise_multiplier=1.0, local_noise=1.0), "local DP adds each client's own noise and no server noise"),
    (dict(log_unaccounted="yes"), "log_unaccounted: must be true or false, got 'yes'"),
])
def test_bad_settings_are_refused_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DPFedAvg(**kwargs)


@pytest.mark.parametrize("settings, match", [
    (dict(sampler="uniform"), "sampler: DP-FedAvg's accountant assumes Poisson sampling"),
    (dict(weighting="size"), "weighting: DP-FedAvg weighs every counting client by 1/m"),
    (dict(channel=0.5), "channel: DP-FedAvg clips each update before any compression"),
])
def test_compositions_the_accountant_cannot_account_for_are_refused_before_round_0(settings, match):
    m = _module(algorithm="dp_fedavg", combination=DPFedAvg(noise_multiplier=1.0, clip=0.5), **settings)
    before = flat_weights(m).clone()
    with pytest.raises(ValueError, match=match):
        run_rounds(m, _digits(), 2)
    assert torch.equal(flat_weights(m), before)


def test_a_calibrated_budget_runs_every_planned_round_and_ends_within_it():
    m = _module(algorithm="dp_fedavg", fraction=0.3,
                combination=DPFedAvg(noise_multiplier=None, target_epsilon=3.0, clip=0.5))
    t = run_rounds(m, _digits(), 4)
    assert t.global_step == 4 and m.runs[0].status == "done" and m.runs[0].error is None
    assert m.last_round.extra["privacy/epsilon"] <= 3.0


def test_an_unreachable_budget_is_refused_before_round_0():
    # RDP's conversion to (ε, δ) costs at least log(1/δ)/(α_max - 1) ≈ 0.015 at δ = 1e-10, whatever the noise
    m = _module(algorithm="dp_fedavg", fraction=1.0,
                combination=DPFedAvg(noise_multiplier=None, target_epsilon=1e-3, delta=1e-10, clip=0.5))
    before = flat_weights(m).clone()
    with pytest.raises(ValueError, match="target_epsilon: 0.001 cannot be reached in 2 rounds"):
        run_rounds(m, _digits(), 2)
    assert torch.equal(flat_weights(m), before)


def test_a_budget_stops_the_run_before_a_round_would_spend_more_with_its_evaluation_and_a_checkpoint(tmp_path):
    from lightning.pytorch import Trainer

    from lfed.lightning.checkpoint import RoundCheckpoint

    delta = 1 / 10 ** 1.1
    e3, e4 = epsilon({(0.3, 1.0): 3}, delta), epsilon({(0.3, 1.0): 4}, delta)
    budget = (e3 + e4) / 2  # rounds 1-3 fit in it, round 4 would not
    m = _module(algorithm="dp_fedavg", fraction=0.3,
                combination=DPFedAvg(noise_multiplier=1.0, clip=0.5, target_epsilon=budget))
    t = Trainer(max_steps=10, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                num_sanity_val_steps=0, val_check_interval=10, check_val_every_n_epoch=None,
                callbacks=[RoundCheckpoint(dirpath=tmp_path, every_n_train_steps=10)])
    t.fit(m, datamodule=_digits())
    assert t.global_step == 3 and m.combination.accountant.rounds == 3
    assert m.runs[0].status == "stopped" and "privacy budget: round 3 would spend" in m.runs[0].error
    assert m.last_round.extra["privacy/epsilon"] == e3 <= budget
    assert [r for r, _ in m.eval_history] == [3]  # the final evaluation of where it stopped
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 3 and saved["lfed"]["runs"][0]["status"] == "stopped"


# ---------------------------------------------------------------------- every component under DP (docs/privacy.md)
def _norm_net(norm: str) -> torch.nn.Module:
    layer = {"batch": torch.nn.BatchNorm1d(16), "batch_untracked": torch.nn.BatchNorm1d(16, track_running_stats=False),
             "group": torch.nn.GroupNorm(4, 16), "layer": torch.nn.LayerNorm(16)}[norm]
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), layer, torch.nn.ReLU(), torch.nn.Linear(16, 10))


def _dp_row(**kwargs) -> dict:
    return dict(algorithm="dp_fedavg", fraction=0.5, combination=DPFedAvg(noise_multiplier=1.0, clip=0.5), **kwargs)


#: One row of docs/privacy.md's table each: (the module's settings, the refusal's start, or None: it runs).
COMPONENTS_UNDER_DP = {
    "objective: plain": (lambda: _dp_row(objective="plain"), None),
    "objective: prox": (lambda: _dp_row(objective="prox"), None),
    "objective: scaffold": (lambda: _dp_row(objective="scaffold"), "objective: SCAFFOLD's server control variate c"),
    "objective: scaffold with control_clip, control_noise (DP-SCAFFOLD)": (lambda: _dp_row(
        objective=__import__("lfed.client.objectives").client.objectives.Scaffold(control_clip=1.0, control_noise=3.0)),
        None),
    "objective: efl": (lambda: _dp_row(objective="efl"), "objective: EFL's Fisher sums U and V"),
    "objective: igfl": (lambda: _dp_row(objective="igfl"), "objective: IGFL-C scales every client's step"),
    "objective: feddyn": (lambda: _dp_row(objective="lfed.client.feddyn.FedDyn"), "objective: FedDyn's server state h"),
    "objective: ditto": (lambda: _dp_row(objective="lfed.personal.ditto.Ditto"), None),
    "objective: fedavg_ft": (lambda: _dp_row(objective="lfed.personal.finetune.FedAvgFT"), None),
    "objective: fedper": (lambda: _dp_row(objective="lfed.personal.fedper.FedPer"), None),
    "objective: fedrep": (lambda: _dp_row(objective="lfed.personal.fedrep.FedRep"), None),
    "objective: apfl": (lambda: _dp_row(objective="lfed.personal.apfl.APFL"), None),
    "objective: fedbn": (lambda: _dp_row(objective="lfed.personal.fedbn.FedBN", net=_norm_net("layer")), None),
    "objective: perfedavg": (lambda: _dp_row(objective="lfed.personal.perfedavg.PerFedAvg"), None),
    "objective: fedrod": (lambda: _dp_row(objective="lfed.personal.fedrod.FedRoD"), None),
    "combination: self, global, time": (lambda: _dp_row() | {"combination": "global"},
                                        "combination: 'global' would replace the preset's DP-FedAvg"),
    "combination: mean": (lambda: _dp_row() | {"combination": "mean"}, "combination: 'mean' would replace"),
    "combination: a robust rule (median, krum, bulyan, ...)": (lambda: _dp_row() | {"combination": "krum"},
                                                               "combination: 'krum' would replace the preset's DP-FedAvg"),
    "attack: sign_flip, gaussian, scaling, label_flip": (
        lambda: _dp_row(attack=__import__("lfed.robust.attacks").robust.attacks.SignFlip(fraction=0.2)), None),
    "attack: alie, ipm, min_max, min_sum, mimic (omniscient)": (
        lambda: _dp_row(attack=__import__("lfed.robust.attacks").robust.attacks.ALIE(fraction=0.2)),
        "attack: the ALIE attack reads the honest clients' raw updates"),
    "weighting: uniform": (lambda: _dp_row(weighting="uniform"), None),
    "weighting: size": (lambda: _dp_row(weighting="size"), "weighting: DP-FedAvg weighs every counting client by 1/m"),
    "weighting: dwfed": (lambda: _dp_row(weighting="dwfed"), "weighting: DWFed's weights come from each client's label"),
    "sampler: poisson": (lambda: _dp_row(sampler="poisson"), None),
    "sampler: uniform": (lambda: _dp_row(sampler="uniform"), "sampler: DP-FedAvg's accountant assumes Poisson sampling"),
    "sampler: attention": (lambda: _dp_row(sampler="attention"), "sampler: AdaFL's sampling scores move"),
    "channel": (lambda: _dp_row(channel=0.5), "channel: DP-FedAvg clips each update before any compression"),
    "partial_work, p_inactive, p_incomplete": (
        lambda: _dp_row(partial_work="drop", stragglers=dict(p_inactive=0.2, p_incomplete=0.3)), None),
    "server_optimizer": (lambda: _dp_row() | {"algorithm": "dp_fedadam"}, None),
    "net: BatchNorm running statistics": (lambda: _dp_row(net=_norm_net("batch"), backend="loop"),
                                          "net: the net's BatchNorm running statistics (2.running_mean, 2.running_var"),
    "net: LayerNorm, GroupNorm, BatchNorm(track_running_stats=False)": (
        lambda: _dp_row(net=torch.nn.Sequential(_norm_net("layer"), torch.nn.GroupNorm(2, 10),
                                                torch.nn.BatchNorm1d(10, track_running_stats=False))), None),
    "target_quantile (adaptive clipping)": (lambda: _dp_row() | {"combination": DPFedAvg(
        noise_multiplier=1.0, clip=0.5, target_quantile=0.5, count_noise=2.0)}, None),
    "local_noise (local DP)": (lambda: _dp_row() | {"combination": DPFedAvg(noise_multiplier=0.0, local_noise=1.0)},
                               None),
    "asynchronous: FedBuff, FedAsync": (lambda: _dp_row(asynchronous=__import__("lfed.core.asynchronous").core.asynchronous.FedBuff(
        concurrency=4, buffer=2)), "asynchronous: combination: DPFedAvg is not implemented asynchronously"),
    "local_noise with target_quantile": (lambda: _dp_row() | {"combination": DPFedAvg(
        noise_multiplier=0.0, local_noise=1.0, target_quantile=0.5)}, "target_quantile: adaptive clipping sends each "
        "client's clipped-or-not bit to the server un-noised"),
}


def test_the_docs_table_of_components_under_dp_is_the_tested_one():
    from conftest import REPO

    rows = [line.split("|")[1].strip() for line in (REPO / "docs" / "privacy.md").read_text().splitlines()
            if line.startswith("| `")]
    assert [r.strip("`") for r in rows] == list(COMPONENTS_UNDER_DP)


@pytest.mark.parametrize("row", list(COMPONENTS_UNDER_DP))
def test_every_component_under_dp_is_refused_in_one_line_before_round_0_or_runs_accounted(row):
    """A refused row raises its one line before any round (while the module is built, or before round 0: the
    weights unchanged, nothing accounted); an allowed one runs two rounds, each accounted."""
    settings, refused = COMPONENTS_UNDER_DP[row]
    data = _digits(20)
    if refused is None:
        m = _module(**settings())
        run_rounds(m, data, 2)
        assert m.combination.accountant.rounds == 2 and math.isfinite(m.last_round.extra["privacy/epsilon"])
        return
    with pytest.raises(ValueError) as info:
        m = _module(**settings())
        before = flat_weights(m).clone()
        try:
            run_rounds(m, data, 2)
        finally:
            assert torch.equal(flat_weights(m), before) and m.combination.accountant.rounds == 0
    message = str(info.value)
    assert message.startswith(refused) and "\n" not in message, message
    if "ε would not hold" in message:  # a release: what to use instead
        assert message.endswith("with DP"), message


# ---------------------------------------------------------------------- metrics under DP (docs/privacy.md)
def test_the_metric_gate_by_hand():
    from lfed.base.metric_gate import MetricGate

    metrics = {"test/acc": 0.5, "train/loss": 1.0, "final/rounds_to_0.8": 3.0, "global_val/acc_mean": 0.2}
    private = ("test/*", "final/rounds_to_*", "val/*")
    assert MetricGate("all", private)(metrics) == metrics
    assert MetricGate("drop", private)(metrics) == {"test/acc": 0.5, "final/rounds_to_0.8": 3.0}
    assert MetricGate("mark", private)(metrics) == {"test/acc": 0.5, "unaccounted/train/loss": 1.0,
                                                    "final/rounds_to_0.8": 3.0, "unaccounted/global_val/acc_mean": 0.2}
    dp = DPFedAvg(noise_multiplier=1.0, clip=0.5)
    gate = MetricGate.of([dp, dp, torch.nn.Identity()], ("test/*",))  # the strictest policy; a component counted once
    assert gate.mode == "drop" and gate.private == ("test/*", "privacy/epsilon", "privacy/noise_multiplier", "privacy/clip",
                                                "final/privacy_*")
    assert MetricGate.of([DPFedAvg(noise_multiplier=1.0, clip=0.5, log_unaccounted=True)]).mode == "mark"
    assert MetricGate.of([torch.nn.Identity()]).mode == "all"


#: What a DP run reads from the clients' data without noise and logs (with log_unaccounted: as unaccounted/<name>).
UNNOISED = ["train/loss", "client/local_acc_mean", "privacy/clipped_fraction", "privacy/clients", "round/clients",
            "round/active", "round/weight_sum", "comm/uploads", "comm/bits_up", "client/acc_mean", "client/acc_worst10pct",
            "global/acc_mean", "final/bmta_local", "final/bmta_global", "final/uploads_total"]


class _Capture:
    """Every metric a Lightning logger is given, by name (a Lightning Logger made at call time)."""

    @staticmethod
    def make():
        from lightning.pytorch.loggers import Logger

        class Capture(Logger):
            name, version = "capture", 0

            def __init__(self):
                super().__init__()
                self.logged: dict[str, list[float]] = {}

            def log_hyperparams(self, *args, **kwargs):
                pass

            def log_metrics(self, metrics, step=None):
                for k, v in metrics.items():
                    self.logged.setdefault(k, []).append(float(v))

        return Capture()


def _logged_dp_run(backend, root, **dp_settings):
    from lightning.pytorch import Trainer

    m = _module(backend, algorithm="dp_fedavg", fraction=0.5, evaluation=dict(personal_clients=5),
                combination=DPFedAvg(noise_multiplier=1.0, clip=0.5, **dp_settings))
    logger = _Capture.make()
    t = Trainer(max_steps=3, accelerator="cpu", logger=logger, enable_progress_bar=False, enable_model_summary=False,
                enable_checkpointing=False, num_sanity_val_steps=0, precision="64-true", log_every_n_steps=1,
                check_val_every_n_epoch=None, val_check_interval=3, default_root_dir=root)
    t.fit(m, datamodule=_digits(20))
    return m, {k: v for k, v in logger.logged.items() if k not in ("epoch",)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dp_run_logs_no_unnoised_client_statistic_by_default_and_marks_them_with_log_unaccounted(backend, tmp_path):
    """Default: the logs hold ε, z, the (fixed) clip, the test split's figures and the summary's test figures, and
    nothing else (so no name of UNNOISED, and nothing new slips through undeclared). log_unaccounted: the same private
    names, unchanged, and every UNNOISED name as unaccounted/<name>, never bare; the marked values are the run's own."""
    summary = {"final/test_acc", "final/test_acc_last10pct",  # the test split's, and DP's own end line: ε, δ, z
               "final/privacy_epsilon", "final/privacy_delta", "final/privacy_noise_multiplier"}
    private = {"privacy/epsilon", "privacy/noise_multiplier", "privacy/clip", "test/acc", "test/loss"} | summary
    m, logged = _logged_dp_run(backend, tmp_path / "default")
    assert set(logged) == private, sorted(set(logged) ^ private)
    assert not list((tmp_path / "default").rglob("personal_accuracy.png"))  # per-client accuracies: not drawn
    assert set(m.runs[0].final_summary) == summary
    assert not any(name in logged for name in UNNOISED)

    m, logged = _logged_dp_run(backend, tmp_path / "marked", log_unaccounted=True)
    assert list((tmp_path / "marked").rglob("personal_accuracy.png"))
    marked = {k for k in logged if k.startswith("unaccounted/")}
    assert set(logged) - marked == private
    assert {"unaccounted/" + name for name in UNNOISED} <= marked, sorted({"unaccounted/" + n for n in UNNOISED} - marked)
    assert not any(k[len("unaccounted/"):] in private for k in marked)
    last = m.last_round
    counting = int(last.cohort.counting.sum())
    assert logged["unaccounted/privacy/clients"][-1] == counting == logged["unaccounted/comm/uploads"][-1]
    active = last.cohort.active
    assert logged["unaccounted/train/loss"][-1] == pytest.approx(float(last.losses[active].mean()), rel=1e-12)
    assert "final/bmta_local" not in m.runs[0].final_summary and "unaccounted/final/bmta_local" in m.runs[0].final_summary


def test_a_run_without_dp_logs_every_metric_under_its_own_name(tmp_path):
    from lightning.pytorch import Trainer

    m = _module(algorithm="fedavg", fraction=0.5, evaluation=dict(personal_clients=5))
    logger = _Capture.make()
    t = Trainer(max_steps=3, accelerator="cpu", logger=logger, enable_progress_bar=False, enable_model_summary=False,
                enable_checkpointing=False, num_sanity_val_steps=0, precision="64-true", log_every_n_steps=1,
                check_val_every_n_epoch=None, val_check_interval=3, default_root_dir=tmp_path)
    t.fit(m, datamodule=_digits(20))
    assert not any(k.startswith("unaccounted/") for k in logger.logged)
    assert {"train/loss", "client/local_acc_mean", "client/acc_mean", "round/clients", "comm/uploads"} <= set(logger.logged)


def test_the_clipped_fraction_is_the_noised_count_by_hand():
    """Adaptive clipping: privacy/clipped_fraction = 1 - b̃, b̃ = (Σ_k 1[‖Δ_k‖ ≤ C] + σ_b ξ) / m with ξ the first draw of
    the round's stream (seed 7, round r, "dp-noise"), m the expected cohort; the same b̃ moves the clip. A fixed clip
    reports the un-noised share of the counting clients, not declared private (not logged under DP by default)."""
    from lfed.rng import round_generator

    sigma_b, m, C, gamma, lr = 0.7, 4.0, 1.0, 0.5, 0.2
    dp = _dp(2, noise_multiplier=0.5, clip=C, target_quantile=gamma, clip_lr=lr, count_noise=sigma_b)
    updates = torch.tensor([[0.5, 0.0], [2.0, 0.0], [3.0, 0.0], [0.0, 0.9]], dtype=torch.float64)  # norms .5, 2, 3, .9
    for r in range(2):
        dp.set_state("clip", torch.tensor(C, dtype=torch.float64))
        dp.combine(updates, None, _cohort(r, 4, m, counting=[True, True, True, False]))
        xi = float(torch.randn((), generator=round_generator(7, r, "dp-noise"), dtype=torch.float64))
        b_noised = (1 + sigma_b * xi) / m  # of the counting clients, only the first is under C = 1 (the 4th does not count)
        report = dp.report(None)
        assert float(report["privacy/clipped_fraction"]) == pytest.approx(1 - b_noised, rel=1e-15, abs=1e-15)
        assert float(report["privacy/clipped_fraction"]) != pytest.approx(2 / 3)  # not the un-noised share
        assert float(report["privacy/clip_next"]) == pytest.approx(C * math.exp(-lr * (b_noised - gamma)), rel=1e-15)
    private = declaration(dp).releases.private_metrics
    assert "privacy/clipped_fraction" in private and "privacy/clients" not in private

    fixed = _dp(2, noise_multiplier=0.5, clip=C)
    fixed.combine(updates, None, _cohort(0, 4, m, counting=[True, True, True, False]))
    assert float(fixed.report(None)["privacy/clipped_fraction"]) == pytest.approx(2 / 3, rel=1e-15)
    assert "privacy/clipped_fraction" not in declaration(fixed).releases.private_metrics


def test_log_unaccounted_is_reachable_from_the_command_line(tmp_path):
    """configs/dp_digits.yaml with --model.combination.init_args.log_unaccounted=true: metrics.csv has the marked
    columns; without it, none of them and none bare."""
    import csv

    from conftest import REPO

    from lfed.lightning.cli import run_cli

    def columns(where, *extra):
        run_cli(["fit", "--config", str(REPO / "configs" / "dp_digits.yaml"), "--trainer.max_steps=2",
                 "--trainer.val_check_interval=2", "--trainer.enable_checkpointing=false",
                 "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path / where}", *extra])
        (path,) = (tmp_path / where).rglob("metrics.csv")
        with open(path, newline="") as f:
            return set(next(csv.reader(f)))

    marked = columns("marked", "--model.combination.init_args.log_unaccounted=true")
    assert {"unaccounted/train/loss", "unaccounted/privacy/clipped_fraction", "unaccounted/client/acc_mean"} <= marked
    plain = columns("plain")
    assert "privacy/epsilon" in plain and "test/acc" in plain
    assert not any(c.startswith("unaccounted/") or c in UNNOISED for c in plain)


# ---------------------------------------------------------------------- DP-SCAFFOLD (docs/privacy.md)
def test_dp_scaffold_control_variate_by_hand():
    """c ← c + (Σ_{k counting} clip(Δc_k, C_c) + z_c C_c ξ) / N, Δc_k = c_k_new - c_k = -c + (w_start - w_end_k)/(K_k η),
    ξ the round's stream (seed 7, round r, "dp-control-noise"); a client that does not count adds 0 but keeps its own
    c_k_new (SCAFFOLD's client state stays on the client)."""
    from lfed.client.objectives import Scaffold
    from lfed.rng import round_generator

    N, P, lr, C_c, z_c = 10, 3, 0.1, 0.5, 1.7
    rule = Scaffold(control_clip=C_c, control_noise=z_c)
    rule.setup_state(standalone_store(), torch.ones(N), P, torch.zeros(1, dtype=torch.float64))
    w_start = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    w_end = torch.tensor([[0.9, -1.0, 0.5], [1.0, -1.3, 0.1], [0.0, 0.0, 0.0]], dtype=torch.float64)
    cohort = _cohort(0, 3, 3.0, N=N, counting=[True, True, False])
    cohort.clients = torch.tensor([2, 5, 7])
    cohort.steps_done = torch.tensor([2, 4, 1])
    rule.after_local(cohort, w_start, w_end, lr, None)
    change = (w_start - w_end) / (torch.tensor([2.0, 4.0, 1.0], dtype=torch.float64)[:, None] * lr)  # c = c_k = 0
    xi = torch.randn(P, generator=round_generator(7, 0, "dp-control-noise"), dtype=torch.float64)
    clipped = [row * min(1.0, C_c / float(torch.linalg.vector_norm(row))) for row in change[:2]]
    want = (clipped[0] + clipped[1] + z_c * C_c * xi) / N
    torch.testing.assert_close(rule.state("control"), want, atol=1e-15, rtol=0)
    torch.testing.assert_close(rule.rows("client_control", torch.tensor([2, 5, 7])), change, atol=1e-15, rtol=0)
    assert float(torch.linalg.vector_norm(change[1])) > C_c  # the second row was clipped
    said = declaration(rule).releases
    assert said.values == () and said.dp_shares == (z_c,)
    assert declaration(Scaffold()).releases.values and declaration(Scaffold()).releases.dp_shares == ()
    with pytest.raises(ValueError, match="control_clip, control_noise: DP-SCAFFOLD clips the control updates"):
        Scaffold(control_clip=0.5)
    with pytest.raises(ValueError, match="control_noise: must be a finite number > 0"):
        Scaffold(control_clip=0.5, control_noise=0.0)


def test_dp_scaffold_takes_its_share_of_the_noise_multiplier():
    """z_Δ = (z⁻² - z_c⁻²)^(-1/2) (with adaptive clipping also - (2σ_b)⁻²), so the round stays one Gaussian mechanism
    of multiplier z: the accountant's (q, z). z_c ≤ z leaves the updates nothing: refused, naming control_noise."""
    from lfed.base.component import CompositionContext
    from lfed.client.objectives import Scaffold

    def prepared(z, z_c, **extra):
        dp = DPFedAvg(noise_multiplier=z, clip=0.5, delta=1e-5, **extra)
        dp.check(CompositionContext(frozenset(), num_clients=10, cohort_sizes=[5],
                                          components={"objective": Scaffold(control_clip=1.0, control_noise=z_c),
                                                      "combination": dp}))
        return dp

    assert prepared(1.0, 2.0).update_multiplier == pytest.approx((1 - 1 / 4) ** -0.5, rel=1e-15)
    assert prepared(1.0, 2.0, target_quantile=0.5, count_noise=1.5).update_multiplier == pytest.approx(
        (1 - 1 / 4 - 1 / 9) ** -0.5, rel=1e-15)
    with pytest.raises(ValueError, match="control_noise: the components' own noise multipliers \\[1.0\\] leave"):
        prepared(1.0, 1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dp_scaffold_run_is_accounted_at_z_and_its_control_variate_is_noised(backend):
    """Two rounds of DP-SCAFFOLD at q = 0.5: ε is dp-accounting's for (q, z) (the shares are inside z); the server's c
    moves with the noise: z_c = 2 and z_c = 2000 give controls whose difference is the noise's (norm ~ z_c C_c √P / N)."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    from lfed.client.objectives import Scaffold

    controls = {}
    for z_c in (2.0, 2000.0):
        m = _module(backend, algorithm="dp_fedavg", fraction=0.5, objective=Scaffold(control_clip=0.5, control_noise=z_c),
                    combination=DPFedAvg(noise_multiplier=1.0, clip=0.5))
        run_rounds(m, _digits(), 2)
        library = rdp_privacy_accountant.RdpAccountant()
        library.compose(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(1.0)), 2)
        assert m.last_round.extra["privacy/epsilon"] == library.get_epsilon(1 / 10 ** 1.1)
        controls[z_c] = m.objective.state("control").clone()
    gap = float(torch.linalg.vector_norm(controls[2000.0] - controls[2.0]))
    expected = 1998 * 0.5 * math.sqrt(2 * 1210) / 10  # two rounds of noise, the same draws scaled by z_c
    assert gap == pytest.approx(expected, rel=0.1)


@pytest.mark.parametrize("log_unaccounted", [False, True])
def test_the_communication_table_of_a_dp_run_is_kept_only_with_log_unaccounted(tmp_path, log_unaccounted):
    """lfed.lightning.callbacks.CommunicationCost records the realised uploads (an un-noised count of the clients)."""
    from lfed.lightning.callbacks import CommunicationCost

    cost = CommunicationCost(dirpath=str(tmp_path))
    m = _module(algorithm="dp_fedavg", fraction=0.5,
                combination=DPFedAvg(noise_multiplier=1.0, clip=0.5, log_unaccounted=log_unaccounted))
    run_rounds(m, _digits(), 2, callbacks=[cost])
    assert (tmp_path / "communication.csv").exists() == log_unaccounted
    assert len(cost.rows) == (2 if log_unaccounted else 0)


def test_a_calibrated_noise_multiplier_is_said_before_round_0(monkeypatch):
    """Issue 66 item 9: z calibrated from target_epsilon was printed only in the end-of-run summary; the start-up
    notices say it (the value the run then uses), with what it was calibrated for."""
    lines = []
    monkeypatch.setattr("lfed.lightning.driver.rank_zero_info", lambda message, *a, **k: lines.append(message))
    m, _, _ = _fit_dp(1, noise_multiplier=None, target_epsilon=8.0, clip=0.5)
    dp = m.runs[0].components.combination
    [line] = [x for x in lines if "calibrated for target_epsilon" in x]
    assert f"z = {dp.noise_multiplier:.4g}" in line and "target_epsilon 8 at delta" in line and "over 1 rounds" in line
    assert lines.index(line) < next(i for i, x in enumerate(lines) if "DP noise and Poisson cohorts" in x)
