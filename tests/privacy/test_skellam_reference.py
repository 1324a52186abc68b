"""lfed's Skellam accountant (lfed.privacy.distributed_dp) against the authors' own code and published test numbers.

References (public repositories; the code below is transcribed from them as an independent reference, not imported):

* [GRF] google-research/federated, ``distributed_dp/accounting_utils.py``, commit
  5e27a86323a35c2018fb97fbbe755c7ade9370ab: the accounting code of Agarwal, Kairouz, Liu, *The Skellam Mechanism for
  Differentially Private Federated Learning* (NeurIPS 2021) and of Kairouz, Liu, Steinke, *The Distributed Discrete
  Gaussian Mechanism* (ICML 2021): ``_skellam_rdp``, ``skellam_epsilon``, ``rounded_l2_norm_bound``,
  ``rounded_l1_norm_bound``, ``heuristic_scale_factor``, ``skellam_params`` (``k=3``), ``RDP_ORDERS``.
* [TFP] tensorflow/privacy, ``tensorflow_privacy/privacy/analysis/rdp_accountant.py``, ``_compute_eps`` (the
  conversion ``get_privacy_spent`` applies; [GRF] calls ``tfp.get_privacy_spent``): the improved RDP → (ε, δ)
  conversion ``eps = r + log1p(-1/a) - log(delta*a)/(a-1)``.
* [TFF] google-parfait/tensorflow-federated, ``tensorflow_federated/python/aggregators/discretization_test.py``,
  commit 992c0cdd14974b2e7647428b59b4b08b8922c51d, ``InflatedNormTest.test_inflated_l2_norm_bound``: published
  expected values of the inflated L2 norm after (conditional) randomized rounding to a grid of granularity γ
  ("computed independently in Python using Equations (18) and (19) in Section 4.1 of arXiv:2102.06387"), checked
  there with ``assertAllClose`` (rtol = atol = 1e-6).

No repository found gives expected ε or RDP numbers for the Skellam accountant itself (the authors' repository has no
``accounting_utils_test.py``; ``distributed_skellam_query_test.py`` tests only the noise), so the ε checks compare lfed
with the transcription of [GRF] on a grid of settings.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_dp_fedavg import _cohort

from lfed.privacy.distributed_dp import (
    K_STDDEVS,
    MAX_RATE,
    ORDERS,
    DistributedDP,
    rounded_l2_bound,
    skellam_epsilon,
    skellam_rdp,
)

# ---------------------------------------------------------------------- [GRF] / [TFP], transcribed
GRF_RDP_ORDERS = tuple(range(2, 129)) + (256,)


def grf_rounded_l2_norm_bound(l2_norm_bound, beta, dim):
    bound_1 = l2_norm_bound + np.sqrt(dim)
    if beta == 0:
        return bound_1
    squared_bound_2 = np.square(l2_norm_bound) + 0.25 * dim
    squared_bound_2 += np.sqrt(2.0 * np.log(1.0 / beta)) * (l2_norm_bound + 0.5 * np.sqrt(dim))
    bound_2 = np.sqrt(squared_bound_2)
    return min(bound_1, bound_2)


def grf_rounded_l1_norm_bound(l2_norm_bound, dim):
    return l2_norm_bound * min(np.sqrt(dim), l2_norm_bound)


def grf_skellam_rdp(l1_sens, l2_sens, central_var, scale, order):
    a, s, mu = order, scale, central_var
    rdp = a / (2 * mu) * l2_sens ** 2
    rdp += min(((2 * a - 1) * s * l2_sens ** 2 + 6 * l1_sens) / (4 * s ** 3 * mu ** 2), 3 * l1_sens / (2 * s * mu))
    return rdp


def tfp_compute_eps(orders, rdp, delta):
    eps_vec = []
    for a, r in zip(np.atleast_1d(orders), np.atleast_1d(rdp)):
        if delta ** 2 + math.expm1(-r) >= 0:
            eps = 0
        elif a > 1.01:
            eps = r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1)
        else:
            eps = np.inf
        eps_vec.append(eps)
    idx = int(np.argmin(eps_vec))
    return max(0, eps_vec[idx]), orders[idx]


def grf_skellam_epsilon(scale, central_stddev, l2_sens, beta, dim, steps, delta, orders=GRF_RDP_ORDERS):
    """[GRF] ``skellam_epsilon`` with ``q = 1`` (no subsampling, as lfed accounts every round) and ``rounding=True``:
    the sensitivities in the *unscaled* domain, the RDP formula carrying the scale ``s`` explicitly."""
    l2_sens = grf_rounded_l2_norm_bound(l2_sens * scale, beta, dim) / scale
    l1_sens = grf_rounded_l1_norm_bound(l2_sens * scale, dim) / scale
    orders = [int(order) for order in orders]
    central_var = central_stddev ** 2
    rdp = np.array([grf_skellam_rdp(l1_sens, l2_sens, central_var, scale, order) for order in orders])
    return tfp_compute_eps(orders, rdp * steps, delta)


def grf_heuristic_scale_factor(local_stddev, l2_clip, bits, num_clients, dim, k_stddevs, rho=1.0):
    c, n, sigma = l2_clip, num_clients, local_stddev
    numer = np.sqrt(2.0 ** (2.0 * bits) - n * k_stddevs ** 2)
    denom = 2.0 * k_stddevs * np.sqrt(rho / dim * c ** 2 * n ** 2 + n * sigma ** 2)
    return numer / denom


def lfed_epsilon(z, C, s, d, beta, steps, delta):
    """lfed's ledger entry for one round, as ``DistributedDP.combine`` forms it, composed ``steps`` times."""
    l2 = rounded_l2_bound(C * s, d, beta)
    l1 = min(math.sqrt(d) * l2, l2 * l2)
    return skellam_epsilon({((z * C * s) ** 2, l2, l1): steps}, delta)


GRID = [  # (z, C, s, d, beta, steps, delta)
    (0.5, 1.0, 1.0, 16, 0.0, 1, 1e-5),           # tiny scale: the L1 = L2² and 3Δ₁/(2μ) branches
    (0.8, 0.1, 30.0, 1024, math.exp(-0.5), 10, 1e-5),
    (1.0, 1.0, 100.0, 2 ** 16, math.exp(-0.5), 100, 1e-5),
    (1.2, 0.03, 1e3, 2 ** 20, math.exp(-0.5), 1500, 1e-6),
    (2.0, 1.0, 5.0, 4096, 0.0, 50, 1e-3),
    (0.3, 2.0, 1e4, 256, 0.2, 3, 1e-7),
    (5.0, 1.0, 50.0, 2 ** 18, math.exp(-0.5), 2000, 1e-5),
    # s C well above √d (little rounding inflation) and much noise (no amplification at q = 1): single-digit ε
    (10.0, 1.0, 3e4, 2 ** 16, math.exp(-0.5), 100, 1e-5),
    (5.0, 0.1, 1e5, 2 ** 20, math.exp(-0.5), 50, 1e-6),
]


# ---------------------------------------------------------------------- the rounded L2 bound: [TFF]'s numbers
@pytest.mark.parametrize("c, gamma, beta, dim, expected", [
    # [TFF] discretization_test.py InflatedNormTest, the eight named cases, verbatim
    (1.0, 1e-9, 0, 1e9, 1.0000316227766017),    # zero_beta_small_gamma
    (1.0, 1e-2, 0, 1e9, 317.2277660168379),     # zero_beta_large_gamma
    (1.0, 1e-9, 0.01, 1e9, 1.000000001642451),  # small_beta_small_gamma
    (1.0, 1e-2, 0.01, 1e9, 158.13231445360802),  # small_beta_large_gamma
    (1.0, 1e-9, 0.5, 1e9, 1.0000000007137142),  # large_beta_small_gamma
    (1.0, 1e-2, 0.5, 1e9, 158.12296930808552),  # large_beta_large_gamma
    (1.0, 1e-9, 1, 1e9, 1.000000000125),        # one_beta_small_gamma
    (1.0, 1e-2, 1, 1e9, 158.11704525445697),    # one_beta_large_gamma
])
def test_the_rounded_l2_bound_gives_tffs_published_inflated_norms(c, gamma, beta, dim, expected):
    """[TFF]'s ``inflated_l2_norm_bound(c, γ, β, d)`` is the bound in the unscaled domain for rounding to the grid γZ,
    i.e. γ · (lfed's bound for the scaled norm c/γ on the integer grid); the same tolerance as [TFF]'s assertAllClose."""
    got = gamma * rounded_l2_bound(c / gamma, int(dim), beta)
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-6)
    # and to float64 precision (lfed computes in float64; [TFF]'s numbers were computed in Python, not float32)
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("c", [0.5, 3.0, 30.0, 1e3, 1e6])
@pytest.mark.parametrize("d", [1, 16, 1000, 2 ** 20])
@pytest.mark.parametrize("beta", [0.0, 1e-3, math.exp(-0.5), 0.9])
def test_the_rounded_l2_bound_is_grfs_rounded_l2_norm_bound(c, d, beta):
    assert rounded_l2_bound(c, d, beta) == pytest.approx(grf_rounded_l2_norm_bound(c, beta, d), rel=1e-14)


# ---------------------------------------------------------------------- the RDP bound: [GRF] _skellam_rdp
@pytest.mark.parametrize("z, C, s, d, beta, steps, delta", GRID)
def test_the_rdp_is_grfs_skellam_rdp_in_the_scaled_domain(z, C, s, d, beta, steps, delta):
    """[GRF] writes the bound in the unscaled domain (Δ₂, Δ₁, σ² of the clipped updates, the scale s explicit);
    lfed in the integer domain (s Δ₂, s Δ₁, s² σ²). Same number at every order."""
    l2_unscaled = grf_rounded_l2_norm_bound(C * s, beta, d) / s
    l1_unscaled = grf_rounded_l1_norm_bound(l2_unscaled * s, d) / s
    l2 = rounded_l2_bound(C * s, d, beta)
    l1 = min(math.sqrt(d) * l2, l2 * l2)
    assert l2 == pytest.approx(s * l2_unscaled, rel=1e-13) and l1 == pytest.approx(s * l1_unscaled, rel=1e-13)
    for a in GRF_RDP_ORDERS:
        ref = grf_skellam_rdp(l1_unscaled, l2_unscaled, (z * C) ** 2, s, a)
        assert skellam_rdp(a, (z * C * s) ** 2, l2, l1) == pytest.approx(ref, rel=1e-12)


def test_both_branches_of_the_min_are_reached_on_the_grid():
    """The grid exercises both terms of the min (else the comparison above would check one branch only)."""
    branches = set()
    for z, C, s, d, beta, _, _ in GRID:
        l2 = rounded_l2_bound(C * s, d, beta)
        l1 = min(math.sqrt(d) * l2, l2 * l2)
        mu = (z * C * s) ** 2
        for a in (2, 64, 256):
            branches.add(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * mu ** 2) < 3 * l1 / (2 * mu))
    assert branches == {True, False}


# ---------------------------------------------------------------------- ε: [GRF] skellam_epsilon + [TFP] conversion
@pytest.mark.parametrize("z, C, s, d, beta, steps, delta", GRID)
def test_epsilon_is_grfs_skellam_epsilon_on_lfeds_orders(z, C, s, d, beta, steps, delta):
    """Same orders: lfed's ε (dp-accounting's compute_epsilon) equals [GRF]'s (tfp's conversion), to 1e-10."""
    ref, _ = grf_skellam_epsilon(s, z * C, C, beta, d, steps, delta, orders=ORDERS)
    assert lfed_epsilon(z, C, s, d, beta, steps, delta) == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("z, C, s, d, beta, steps, delta", GRID)
def test_epsilon_against_grfs_default_orders(z, C, s, d, beta, steps, delta):
    """[GRF]'s default orders are 2..128 and 256; lfed adds 160, 192, 512 and 1024 (all integers, where the bound
    holds too), so lfed's ε is never above [GRF]'s and equals it when the optimal order is one [GRF] has."""
    ref, order = grf_skellam_epsilon(s, z * C, C, beta, d, steps, delta)
    ours = lfed_epsilon(z, C, s, d, beta, steps, delta)
    assert ours <= ref * (1 + 1e-12)
    _, order_ours = grf_skellam_epsilon(s, z * C, C, beta, d, steps, delta, orders=ORDERS)
    if order_ours in GRF_RDP_ORDERS:
        assert ours == pytest.approx(ref, rel=1e-10)


def test_a_high_noise_setting_where_the_extra_orders_matter():
    """z = 50, one round: lfed's optimum is order 192, which [GRF]'s list lacks (its best is 128): lfed's extra orders
    give a smaller, still valid ε (0.0660 against [GRF]'s 0.0702)."""
    z, C, s, d, beta, steps, delta = 50.0, 1.0, 1e3, 1024, math.exp(-0.5), 1, 1e-5
    ref, order = grf_skellam_epsilon(s, z * C, C, beta, d, steps, delta)
    ref_all, order_all = grf_skellam_epsilon(s, z * C, C, beta, d, steps, delta, orders=ORDERS)
    assert (order, order_all) == (128, 192) and ref_all < ref
    assert (ref, ref_all) == (pytest.approx(0.07024, abs=1e-4), pytest.approx(0.06598, abs=1e-4))
    assert lfed_epsilon(z, C, s, d, beta, steps, delta) == pytest.approx(ref_all, rel=1e-10)


# ---------------------------------------------------------------------- the scale from bits: [GRF] heuristic_scale_factor
@pytest.mark.parametrize("z, C, bits, n, d", [
    (1.0, 1.0, 20, 4, 4096), (0.5, 0.03, 16, 100, 2 ** 20), (2.0, 10.0, 12, 10, 64), (1e-3, 1.0, 30, 1000, 2 ** 16),
])
def test_the_scale_is_grfs_heuristic_scale_factor_with_k_3(z, C, bits, n, d):
    """lfed's ``derive_scale`` solves 2^b = 2k sqrt(s²(n²C²/d + z²C²) + n/4); [GRF] solves the same with the local
    stddev σ = zC/√n (n σ² = z²C²), ρ = 1 and k = 3 (``skellam_params``' default; [TFF]'s DistributedDpSumFactory
    instead derives k ≈ 3.89 from modclip_prob = 1e-4). The expected cohort is the n clients (m = n), at which lfed's
    second bound, each share's Poisson rate (zCs)²/(2m) ≤ MAX_RATE, does not bind in these settings (asserted)."""
    assert K_STDDEVS == 3.0
    ddp = DistributedDP(noise_multiplier=z, clip=C, bits=bits, delta=1e-5)
    ref = grf_heuristic_scale_factor(z * C / math.sqrt(n), C, bits, n, d, 3.0)
    assert (z * C * ref) ** 2 / (2 * n) < MAX_RATE
    assert ddp.derive_scale(n, d, m=n) == pytest.approx(ref, rel=1e-12)


# ---------------------------------------------------------------------- end to end: a round's ledger entry
@pytest.mark.parametrize("z, C, bits, P", [(1.0, 1.0, 20, 100), (0.7, 0.5, 16, 1000)])
def test_a_rounds_epsilon_is_grfs_for_the_same_scale_noise_and_padded_dimension(z, C, bits, P):
    """One ``combine`` of m = 4 clients with no dropout: the accountant's ε after 1 and 3 rounds equals [GRF]'s
    ``skellam_epsilon(scale=s, central_stddev=zC, l2_sens=C, beta, dim=d padded, q=1)`` on lfed's orders."""
    m = 4
    ddp = DistributedDP(noise_multiplier=z, clip=C, bits=bits, delta=1e-5)
    ddp.k_max = m
    updates = torch.randn(m, P, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    d = 1 << (P - 1).bit_length()
    for r in range(3):
        ddp.combine(updates, None, _cohort(r, m, float(m)))
        ref, _ = grf_skellam_epsilon(ddp.scale, z * C, C, ddp.beta, d, r + 1, 1e-5, orders=ORDERS)
        assert ddp.accountant.epsilon(1e-5) == pytest.approx(ref, rel=1e-10)
    assert ddp.scale == pytest.approx(grf_heuristic_scale_factor(z * C / math.sqrt(m), C, bits, m, d, 3.0), rel=1e-12)
