"""Distributed DP with the Skellam mechanism (lfed.privacy.distributed_dp; Agarwal, Kairouz, Liu 2021): the rotation,
rounding and noise by hand, the RDP bound at chosen values, its Gaussian limit, honest accounting of dropouts,
refusals before round 0, a run through the round, and the one-run audit with planted leaks."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import run_rounds
from test_dp_fedavg import _cohort, _digits, _module

from lfed.base.component import Cohort, CompositionContext
from lfed.participation.sampling import AttentionSampler
from lfed.privacy.audit import CanaryDistributedDP
from lfed.privacy.distributed_dp import (
    MAX_RATE,
    ORDERS,
    DistributedDP,
    conditional_rounding,
    hadamard,
    rotate,
    rounded_l2_bound,
    skellam_epsilon,
    skellam_noise,
    skellam_rdp,
    unrotate,
)
from lfed.server.weighting import SizeWeights, UniformWeights


def test_the_hadamard_rotation_by_hand():
    """H_4 (Sylvester) by hand; R = H D / √d is orthonormal: it keeps norms and unrotate inverts it."""
    assert hadamard(torch.eye(4, dtype=torch.float64)).tolist() == [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1],
                                                                      [1, -1, -1, 1]]
    assert hadamard(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).tolist() == [[10.0, -2.0, -4.0, 0.0]]
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = rotate(x, 8, seed=1, round=2)
    torch.testing.assert_close(torch.linalg.vector_norm(y, dim=1), torch.linalg.vector_norm(x, dim=1), atol=1e-14, rtol=0)
    torch.testing.assert_close(unrotate(y, 5, seed=1, round=2), x, atol=1e-14, rtol=0)
    with pytest.raises(ValueError, match="hadamard: the last dimension must be a power of two, got 6"):
        hadamard(torch.zeros(6))


def test_the_rounded_norm_bound_and_conditional_rounding_by_hand():
    """c = 3, d = 16: β = 0 gives c + √d = 7; β = e^{-1/2} (√(2 ln(1/β)) = 1) gives √(9 + 4 + (3 + 2)) = √18.
    Conditional rounding: every coordinate is ⌊y⌋ or ⌊y⌋ + 1, every row within the bound."""
    assert rounded_l2_bound(3.0, 16, 0.0) == 7.0
    assert rounded_l2_bound(3.0, 16, math.exp(-0.5)) == pytest.approx(math.sqrt(18), rel=1e-14)
    y = torch.rand(50, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1.5 - 0.75
    y = y * (3.0 / torch.linalg.vector_norm(y, dim=1, keepdim=True))
    bound = math.sqrt(18)
    out = conditional_rounding(y, bound, torch.Generator().manual_seed(1))
    assert bool(((out == torch.floor(y)) | (out == torch.floor(y) + 1)).all())
    assert float(torch.linalg.vector_norm(out, dim=1).max()) <= bound
    with pytest.raises(RuntimeError, match="conditional rounding: a row's norm stayed above 1"):
        conditional_rounding(torch.full((1, 16), 0.5, dtype=torch.float64), 1.0, torch.Generator(), tries=5)


def test_skellam_noise_is_integer_with_the_asked_variance():
    """Poisson(v/2) - Poisson(v/2): integers, mean 0, variance v (200,000 draws: the estimate's error ~0.3%)."""
    noise = skellam_noise((200000,), 3.0, torch.Generator().manual_seed(0))
    assert torch.equal(noise, torch.round(noise))
    assert abs(float(noise.mean())) < 0.02
    assert abs(float(noise.var()) / 3.0 - 1) < 0.02


def test_the_skellam_rdp_bound_by_hand():
    """α = 2, μ = 100, Δ₂ = 10, Δ₁ = 20: 2·100/200 = 1, plus min((3·100 + 120)/(4·100²), 3·20/200) = 0.0105. The
    paper's form in the Poisson rate λ = μ/2: αΔ₂²/(4λ) + min(((2α-1)Δ₂² + 6Δ₁)/(16λ²), 3Δ₁/(4λ)) is the same."""
    assert skellam_rdp(2, 100.0, 10.0, 20.0) == pytest.approx(1.0105, rel=1e-14)
    lam = 50.0
    paper = 2 * 100 / (4 * lam) + min((3 * 100 + 6 * 20) / (16 * lam ** 2), 3 * 20 / (4 * lam))
    assert skellam_rdp(2, 100.0, 10.0, 20.0) == pytest.approx(paper, rel=1e-14)
    # the second branch of the min: α = 2, μ = 1, Δ₂ = 1, Δ₁ = 1: (3 + 6)/4 = 2.25 > 3/2: 1 + 1.5
    assert skellam_rdp(2, 1.0, 1.0, 1.0) == 2.5
    assert skellam_rdp(2, 0.0, 1.0, 1.0) == math.inf


def test_the_skellam_bound_tends_to_the_gaussian_as_the_scale_grows():
    """μ = (zCs)², Δ₂ = Cs, Δ₁ = √d Δ₂: the RDP is α/(2z²) (the Gaussian of σ = z Δ₂) plus a term that vanishes as
    s grows; ε after 10 rounds converges to the Gaussian's (dp-accounting, same orders)."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    z, C, d, alpha = 1.2, 1.0, 1024, 8
    gaps = []
    for s in (1e1, 1e2, 1e3, 1e4):
        l2 = C * s
        gaps.append(skellam_rdp(alpha, (z * l2) ** 2, l2, math.sqrt(d) * l2) / (alpha / (2 * z * z)) - 1)
    assert all(g > 0 for g in gaps) and gaps == sorted(gaps, reverse=True) and gaps[-1] < 1e-3
    s = 1e5
    ours = skellam_epsilon({((z * C * s) ** 2, C * s, math.sqrt(d) * C * s): 10}, 1e-5)
    gaussian = rdp_privacy_accountant.RdpAccountant(orders=list(ORDERS))
    gaussian.compose(dp_accounting.GaussianDpEvent(z), 10)
    assert ours == pytest.approx(gaussian.get_epsilon(1e-5), rel=1e-3)


def _ddp(**kwargs) -> DistributedDP:
    ddp = DistributedDP(**{"delta": 1e-5, **kwargs})
    ddp.k_max = 4
    return ddp


def test_the_noise_of_the_mean_has_standard_deviation_z_c_over_m():
    """Zero updates from m = 4 clients, P = 4096: the round releases (Σ Sk(μ/m))/(s·m) rotated back; its standard
    deviation is z·C/m (each share μ/m, μ = (zCs)², four shares), within 5%."""
    z, C, m, P = 1.5, 0.5, 4, 4096
    ddp = _ddp(noise_multiplier=z, clip=C, bits=24)
    delta, _ = ddp.combine(torch.zeros(m, P, dtype=torch.float64), None, _cohort(0, m, float(m)))
    assert abs(float(delta.std()) / (z * C / m) - 1) < 0.05
    mu = (z * C * ddp.scale) ** 2
    l2 = rounded_l2_bound(C * ddp.scale, P, math.exp(-0.5))
    ((v, a, b),) = ddp.accountant.events
    assert (v, a, b) == (pytest.approx(mu), pytest.approx(l2), pytest.approx(min(math.sqrt(P), l2) * l2))


def test_the_clipped_mean_comes_through_when_the_noise_is_small():
    """z = 1e-4, bits = 40: Δ is the fixed-denominator mean of the L2-clipped updates, to within the rounding and the
    noise (both below 1e-3 here). Rows (3, 4, 0...) and (0.3, 0.4, 0...) with C = 1: (0.6, 0.8) and (0.3, 0.4); m = 3."""
    P = 10
    updates = torch.zeros(2, P, dtype=torch.float64)
    updates[0, :2] = torch.tensor([3.0, 4.0])
    updates[1, :2] = torch.tensor([0.3, 0.4])
    ddp = _ddp(noise_multiplier=1e-4, clip=1.0, bits=40)
    delta, _ = ddp.combine(updates, None, _cohort(0, 2, 3.0))
    want = torch.zeros(P, dtype=torch.float64)
    want[:2] = torch.tensor([0.9, 1.2]) / 3
    torch.testing.assert_close(delta, want, atol=1e-3, rtol=0)


def test_dropouts_are_accounted_at_the_noise_that_reached_the_sum():
    """dropout 0.5, m = 4: a round's variance is (survivors) · μ/m; ε grows over a run without dropouts."""
    z, C = 2.0, 1.0
    ddp = _ddp(noise_multiplier=z, clip=C, dropout=0.5)
    plain = _ddp(noise_multiplier=z, clip=C)
    for r in range(3):
        cohort = _cohort(r, 4, 4.0)
        alive = ddp.survivors(4, cohort)
        ddp.combine(torch.zeros(4, 16, dtype=torch.float64), None, cohort)
        plain.combine(torch.zeros(4, 16, dtype=torch.float64), None, cohort)
        mu = (z * C * ddp.scale) ** 2
        assert ddp.report(None)["secagg/dropped"] == float((~alive).sum())
        assert sum(n for (v, _, _), n in ddp.accountant.events.items() if v == pytest.approx(float(alive.sum()) * mu / 4)) >= 1
    assert ddp.accountant.rounds == 3
    assert ddp.accountant.epsilon(1e-5) > plain.accountant.epsilon(1e-5)


def _context(**components) -> CompositionContext:
    return CompositionContext(frozenset(), num_clients=10, total_rounds=3, cohort_sizes=[4, 4, 4],
                              components=components)


@pytest.mark.parametrize("components, match", [
    (dict(weighting=SizeWeights()), "weighting: distributed DP weighs every counting client by 1/m"),
    (dict(sampler=AttentionSampler()), "sampler: AdaFL's sampling scores .*, so distributed DP's ε would not hold"),
])
def test_dp_fedavgs_neighbours_are_refused_before_round_0(components, match):
    ddp = DistributedDP()
    with pytest.raises(ValueError, match=match):
        ddp.check(_context(combination=ddp, **components))
    ddp.check(_context(combination=ddp, weighting=UniformWeights()))
    assert ddp.delta == pytest.approx(1 / 10 ** 1.1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(noise_multiplier=0.0), "noise_multiplier: must be"), (dict(clip=-1.0), "clip: must be"),
    (dict(bits=70), "bits: at most 52 for distributed DP"),
    (dict(bits=53), "bits: at most 52 for distributed DP"), (dict(beta=1.0), "beta: must be"), (dict(dropout=-0.1), "dropout: must be"),
    (dict(noise="urandom"), "noise: 'urandom' is not one of"),
])
def test_bad_settings_are_refused_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DistributedDP(**kwargs)


def test_too_few_bits_for_the_cohort_are_refused_before_round_0():
    """bits = 4: M/(2·3) = 2.67, squared 7.1 ≤ K/4 for K = 40 clients' rounding."""
    ddp = DistributedDP(bits=4)
    with pytest.raises(ValueError, match="bits: 4 bits cannot hold the rounding noise of 40 clients"):
        ddp.check(CompositionContext(frozenset(), num_clients=40, total_rounds=1, cohort_sizes=[40],
                                           components={"combination": ddp}))


def test_three_rounds_on_digits_log_the_accountants_epsilon():
    ddp = DistributedDP(noise_multiplier=1.0, clip=0.5, bits=20)
    m = _module(algorithm="fedavg", weighting="uniform", combination=ddp)
    run_rounds(m, _digits(), 3)
    assert ddp.accountant.rounds == 3
    eps = m.last_round.extra["privacy/epsilon"]
    assert eps == ddp.accountant.epsilon(1 / 10 ** 1.1) and 0 < eps < math.inf
    assert m.last_round.extra["secagg/dropped"] == 0.0


def _audit(leak):
    """400 canaries beside 20 digits clients, q = 1, 5 rounds, z = 6.5 (ε = 1.61 at δ = 1e-6 without amplification)."""
    dp = CanaryDistributedDP(canaries=400, leak=leak, noise_multiplier=6.5, clip=0.5, delta=1e-6, bits=24)
    m = _module(algorithm="fedavg", weighting="uniform", fraction=1.0, combination=dp)
    run_rounds(m, _digits(20), 5)
    return dp.audit()


@pytest.mark.parametrize("leak", [None, "no_noise", "no_clip", "plaintext"])
def test_the_audit_catches_planted_leaks_and_a_correct_run_stays_under_its_epsilon(leak):
    result = _audit(leak)
    assert 1.5 < result.epsilon < 3.0 and result.m == 400
    if leak is None:
        assert result.epsilon_lower <= result.epsilon
    else:
        assert result.epsilon_lower > result.epsilon


def test_summing_without_drawing_the_masks_releases_the_same_round_exactly():
    """masks=False skips the O(K² d) pair masks of secure aggregation: the round's release and its accounting are the
    same, bit for bit (the masks cancel in Z_M), with a dropout too."""
    torch.manual_seed(0)
    updates = torch.randn(4, 100, dtype=torch.float64)
    out = []
    for masks in (True, False):
        ddp = _ddp(noise_multiplier=1.2, clip=1.0, bits=24, dropout=0.3, masks=masks)
        ddp.delta = 1e-5
        delta, _ = ddp.combine(updates, None, _cohort(3, 4, 4.0))
        out.append((delta, ddp.accountant.events, ddp._report["secagg/dropped"]))
    assert torch.equal(out[0][0], out[1][0]) and out[0][1] == out[1][1] and out[0][2] == out[1][2]
    with pytest.raises(ValueError, match="masks: must be true or false"):
        DistributedDP(masks="no")


def test_a_budget_calibrates_the_smallest_noise_before_round_0_and_caps_the_run():
    """target_epsilon with noise_multiplier: null: z is the smallest (to 0.1%) whose ε after the planned rounds, every
    share arriving, is within the budget; the scale is derived for that z; and the round that would go past it is
    refused by stop_before."""
    from lfed.base.component import CompositionContext
    from lfed.privacy.distributed_dp import rounded_l2_bound, skellam_epsilon

    ddp = DistributedDP(noise_multiplier=None, target_epsilon=3.0, clip=0.5, bits=20, delta=1e-5)
    ctx = CompositionContext(frozenset(), num_clients=10, total_rounds=4, cohort_sizes=[4] * 4,
                             components={"combination": ddp}, shared_params=100)
    ddp.check(ctx)
    z, d = ddp.noise_multiplier, 128

    def eps(zz, rounds=4):
        s = ddp.derive_scale(4, d, zz)
        l2 = rounded_l2_bound(0.5 * s, d, ddp.beta)
        return skellam_epsilon({((zz * 0.5 * s) ** 2, l2, min(math.sqrt(d) * l2, l2 * l2)): rounds}, 1e-5)

    assert eps(z) <= 3.0 < eps(z * 0.998)
    assert ddp.scale == ddp.derive_scale(4, d, z) and ddp.depends_on_total_rounds
    for r in range(4):  # four full rounds fit the budget
        assert ddp.stop_before(r, 4, 10) is None
        ddp.combine(torch.zeros(4, 100, dtype=torch.float64), None, _cohort(r, 4, 4.0))
    assert ddp.accountant.epsilon(1e-5) <= 3.0
    assert ddp.stop_before(4, 4, 10).startswith("privacy budget: round 4 would spend ε = ")  # a fifth would not
    with pytest.raises(ValueError, match="noise_multiplier: give a noise multiplier z > 0, or target_epsilon"):
        DistributedDP(noise_multiplier=None)


def test_a_calibrated_run_on_digits_ends_within_its_budget():
    m = _module(algorithm="fedavg", weighting="uniform", fraction=0.4,
                combination=DistributedDP(noise_multiplier=None, target_epsilon=6.0, clip=0.5, bits=20, masks=False))
    run_rounds(m, _digits(), 3)
    dp = m.combination
    assert dp.accountant.rounds == 3 and 5.5 < dp.accountant.epsilon(dp.delta) <= 6.0
    assert m.last_round.extra["privacy/noise_multiplier"] == dp.noise_multiplier > 0


# ---------------------------------------------------------------------- issue 62: the noise, empty rounds, the budget
def test_the_sampler_is_exact_up_to_its_largest_rate_and_refuses_above_it():
    """At MAX_RATE (2^32) torch's Poisson draws have Poisson's mean, variance and parity (400,000 draws: the variance's
    error ~0.2%); a Skellam share of variance 2·MAX_RATE has that variance; above it skellam_noise refuses (0.5 drew
    at any rate: above 2^63 both draws were INT64_MIN and the share carried no noise)."""
    g = torch.Generator().manual_seed(0)
    x = torch.poisson(torch.full((400000,), MAX_RATE, dtype=torch.float64), generator=g)
    assert abs(float(x.mean()) - MAX_RATE) < 5 * math.sqrt(MAX_RATE / 400000)
    assert abs(float(x.var()) / MAX_RATE - 1) < 0.012
    assert abs(float((x % 2).mean()) - 0.5) < 0.005
    noise = skellam_noise((400000,), 2 * MAX_RATE, g)
    assert torch.equal(noise, torch.round(noise)) and abs(float(noise.var()) / (2 * MAX_RATE) - 1) < 0.012
    with pytest.raises(ValueError, match="skellam_noise: a Poisson rate of .* is above .*where torch's sampler is not exact"):
        skellam_noise((4,), 2 * MAX_RATE * 1.001, g)


def test_the_release_is_noised_at_every_accepted_bits():
    """Zero updates of m = 4 clients, P = 4096, z = 1, C = 1: at every ``bits`` distributed DP accepts (2..52; the few
    too small for 4 clients' rounding noise are refused, naming bits), the release's standard deviation is z·C/m within
    5%, the scale keeps each share's Poisson rate at most MAX_RATE, and the ledger is finite. (0.5 released the sum
    with no noise from bits = 36 on, while charging ε.)"""
    z, C, m, P = 1.0, 1.0, 4, 4096
    accepted = []
    for bits in range(2, 53):
        ddp = _ddp(noise_multiplier=z, clip=C, bits=bits)
        try:
            delta, _ = ddp.combine(torch.zeros(m, P, dtype=torch.float64), None, _cohort(0, m, float(m)))
        except ValueError as e:
            assert str(e).startswith(f"bits: {bits} bits cannot hold the rounding noise of 4 clients")
            assert not accepted  # only the smallest are refused
            continue
        accepted.append(bits)
        assert abs(float(delta.std()) / (z * C / m) - 1) < 0.05, bits
        assert (z * C * ddp.scale) ** 2 / (2 * m) <= MAX_RATE
        assert math.isfinite(ddp.accountant.epsilon(1e-5))
    assert accepted[0] <= 4 and accepted[-1] == 52


def test_a_given_scale_above_the_samplers_rate_is_refused_before_round_0():
    """scale = 1e6 with z = 1, C = 1, m = 4: each share's rate 1e12/8 is above MAX_RATE: refused by its check (one
    line naming scale and the largest allowed, √(2·4·2^32) ≈ 185,363); 1e5 is accepted."""
    ctx = _context()
    with pytest.raises(ValueError, match=r"scale: 1e\+06 draws each of the 4 noise shares at Poisson rate 1\.25e\+11, "
                                         r"above 4\.295e\+09 where the sampler is exact; give scale <= 185363"):
        DistributedDP(noise_multiplier=1.0, clip=1.0, scale=1e6, delta=1e-5).check(ctx)
    DistributedDP(noise_multiplier=1.0, clip=1.0, scale=1e5, delta=1e-5).check(ctx)


def test_the_noise_is_k_shares_of_mu_over_m_when_fewer_than_m_clients_count():
    """m = 8 expected, 5 rows of which 3 count: the release's variance is 3·(μ/m) in the integer domain, so Δ has
    standard deviation z·C·√(3/8)/8 (not z·C/8, which shares of μ/K with K the realised cohort would give), within 5%."""
    z, C, m, P = 1.0, 1.0, 8, 8192
    ddp = _ddp(noise_multiplier=z, clip=C, bits=24)
    ddp.k_max = 8
    cohort = _cohort(0, 5, float(m), counting=[True, False, True, False, True])
    delta, _ = ddp.combine(torch.zeros(5, P, dtype=torch.float64), None, cohort)
    assert abs(float(delta.std()) / (z * C * math.sqrt(3 / 8) / 8) - 1) < 0.05
    ((mu, _, _),) = ddp.accountant.events
    assert mu == pytest.approx(3 * (z * C * ddp.scale) ** 2 / 8, rel=1e-12)


def test_a_round_with_no_survivor_releases_nothing_and_costs_nothing():
    """A round where no counting client's upload reaches the sum (every row a non-counting straggler; or every
    counting client dropped) releases 0, independent of the data: ε stays what it was (0.5: ∞ from then on), the
    round is counted as empty, and the next round is accounted as usual."""
    ddp = _ddp(noise_multiplier=1.0, clip=1.0)
    delta, _ = ddp.combine(torch.ones(4, 16, dtype=torch.float64), None, _cohort(0, 4, 4.0, counting=[False] * 4))
    assert torch.equal(delta, torch.zeros(16, dtype=torch.float64))
    assert ddp.accountant.epsilon(1e-5) == 0.0 and ddp.accountant.empty == 1 and ddp.accountant.rounds == 0
    ddp.combine(torch.ones(4, 16, dtype=torch.float64), None, _cohort(1, 4, 4.0))
    spent = ddp.accountant.epsilon(1e-5)
    assert 0 < spent < math.inf
    # dropouts: a round in which all four drop (found from the dropout stream, which is independent of the data)
    drops = _ddp(noise_multiplier=1.0, clip=1.0, dropout=0.7)
    r = next(r for r in range(1000) if not bool(drops.survivors(4, _cohort(r, 4, 4.0)).any()))
    ddp.dropout = 0.7
    delta, _ = ddp.combine(torch.ones(4, 16, dtype=torch.float64), None, _cohort(r, 4, 4.0))
    assert torch.equal(delta, torch.zeros(16, dtype=torch.float64)) and ddp.report(None)["secagg/dropped"] == 4.0
    assert ddp.accountant.epsilon(1e-5) == spent and ddp.accountant.empty == 2 and ddp.accountant.rounds == 1
    again = type(ddp.accountant)()  # the empty rounds resume
    again.load_state_dict(ddp.accountant.state_dict())
    assert again.empty == 2 and again.events == ddp.accountant.events


def _seeded_cohort(r: int, K: int, seed: int) -> Cohort:
    c = Cohort(r, torch.arange(K), torch.ones(K), torch.ones(K), torch.ones(K), 10, expected_size=float(K), seed=seed)
    c.counting = torch.ones(K, dtype=torch.bool)
    return c


def test_a_budget_is_never_overspent_under_dropouts():
    """target_epsilon 3 calibrated for 6 rounds, dropout 0.5, m = 4, over 24 seeds: each round checks the budget with
    every share arriving (stop_before) and, once the survivors are known, the server unmasks the sum only if its
    surviving noise keeps ε within the budget; the realised ε is never above 3 (0.5 ended at 3.18, 3.52 or ∞). Where a
    round is not unmasked, Δ is 0, it costs nothing, and the run stops before the next round with one line saying so."""
    halted = 0
    for seed in range(24):
        ddp = DistributedDP(noise_multiplier=None, target_epsilon=3.0, clip=0.5, bits=20, delta=1e-5, dropout=0.5)
        ddp.check(CompositionContext(frozenset(), num_clients=10, total_rounds=6, cohort_sizes=[4] * 6,
                                           components={"combination": ddp}, shared_params=100))
        for r in range(40):
            if ddp.stop_before(r, 4, 10):
                break
            before = ddp.accountant.epsilon(1e-5)
            delta, _ = ddp.combine(torch.randn(4, 100, dtype=torch.float64), None, _seeded_cohort(r, 4, seed))
            assert ddp.accountant.epsilon(1e-5) <= 3.0, (seed, r)
            if not ddp.report(None)["secagg/unmasked"]:
                assert ddp.accountant.epsilon(1e-5) == before and torch.equal(delta, torch.zeros(100, dtype=torch.float64))
        else:
            raise AssertionError(f"seed {seed}: the run did not stop within 40 rounds")
        line = ddp.stop_before(r, 4, 10)
        if "the server did not unmask it" in line:
            halted += 1
            assert line.startswith("privacy budget: round ") and "surviving noise shares of 4 would spend ε = " in line
    assert halted > 0  # the check after the survivors are known is exercised, not only the one before the round


def test_a_run_with_dropouts_stops_within_its_budget():
    """Through the Trainer on digits: target 4, dropout 0.5, z calibrated for 3 rounds, 10 rounds asked: the run stops
    when the budget is spent, its ε within 4."""
    m = _module(algorithm="fedavg", weighting="uniform", fraction=0.4,
                combination=DistributedDP(noise_multiplier=None, target_epsilon=4.0, clip=0.5, bits=20, masks=False,
                                          dropout=0.5))
    run_rounds(m, _digits(), 10)
    dp, run = m.combination, m.runs[0]
    assert dp.accountant.epsilon(dp.delta) <= 4.0
    assert run.status == "stopped" and run.error.startswith("privacy budget: round ")
