"""The one-run privacy audit (lfed.privacy.audit; Steinke, Nasr, Jagielski 2023): the bound by hand on tiny numbers,
the canaries' insertion by hand, and end to end: planted leaks are caught, a correct run stays under its ε."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import run_rounds
from test_dp_fedavg import _cohort, _digits, _module

from lfed.base.component import standalone_store
from lfed.models.zoo import MLP
from lfed.privacy.audit import CanaryDPFedAvg, epsilon_lower_bound, guess, p_value


def test_the_p_value_by_hand():
    """p = P[Bin(r, q) ≥ v] + 2mδ · max_i (1/i) P[v - i ≤ Bin(r, q) < v], q = e^ε / (1 + e^ε)."""
    delta = 1e-3
    # m = r = v = 2, ε = 0 (q = 1/2): tail 1/4; i = 1: P[Bin = 1] = 1/2; i = 2: (1/2 + 1/4)/2 = 3/8: α = 1/2
    assert p_value(2, 2, 2, 0.0, delta) == pytest.approx(0.25 + 2 * 2 * delta * 0.5, rel=1e-12)
    # m = r = 3, v = 2, ε = 0: tail 1/2; i = 1: 3/8; i = 2: (3/8 + 1/8)/2 = 1/4: α = 3/8
    assert p_value(3, 3, 2, 0.0, delta) == pytest.approx(0.5 + 2 * 3 * delta * 3 / 8, rel=1e-12)
    # m = r = v = 1, ε = ln 3 (q = 3/4): tail 3/4; i = 1: P[Bin = 0] = 1/4
    assert p_value(1, 1, 1, math.log(3), delta) == pytest.approx(0.75 + 2 * delta * 0.25, rel=1e-12)
    assert p_value(3, 3, 2, 0.0, 0.0) == pytest.approx(0.5, rel=1e-12)  # δ = 0: Theorem 3.1, the binomial tail
    assert p_value(1000, 10, 10, 0.0, 0.4) == 1.0  # capped
    with pytest.raises(ValueError, match="v, r, m: need 0 <= v <= r <= m"):
        p_value(3, 2, 3, 1.0, 0.0)


def test_the_lower_bound_by_hand():
    """δ = 0 and every one of k guesses right: p = q^k < β exactly while ε < logit(β^(1/k))."""
    for k, beta in ((10, 0.05), (30, 0.01)):
        q = beta ** (1 / k)
        assert epsilon_lower_bound(k, k, k, 0.0, beta) == pytest.approx(math.log(q / (1 - q)), abs=2e-6)
    assert epsilon_lower_bound(100, 20, 10, 1e-6) == 0.0  # chance accuracy rejects nothing
    assert epsilon_lower_bound(100, 20, 20, 1e-6) < epsilon_lower_bound(100, 40, 40, 1e-6)  # more right guesses: more
    # the δ term 2mδα costs the bound, and rejects nothing once 2mδ is large (m = 1000: δ = 1e-2)
    bounds = [epsilon_lower_bound(1000, 100, 100, d) for d in (0.0, 1e-6, 1e-3, 1e-2)]
    assert bounds[0] > bounds[1] > 3.0 > 1.0 > bounds[2] > bounds[3] == 0.0


def test_guesses_by_hand():
    scores = torch.tensor([0.9, 0.1, 0.5, -0.3, 0.7, 0.0])
    included = torch.tensor([True, False, True, False, False, True])
    # "in": 0.9 (in, right), 0.7 (out, wrong); "out": -0.3 (out, right), 0.0 (in, wrong)
    assert guess(scores, included, 2, 2) == (4, 2)
    assert guess(scores, included, 3, 0) == (3, 2)  # adds 0.5 (in, right)
    with pytest.raises(ValueError, match="guesses: 4 \\+ 3 guesses of 6 canaries"):
        guess(scores, included, 4, 3)


def test_the_canaries_enter_the_aggregate_as_clients_by_hand():
    """z = 0, zero real updates, q = 1 (expected cohort = N): Δ = Σ_{i included} C u_i / m, each canary's row clipped
    like a client's (norm C, so unchanged), the real cohort's fixed denominator m."""
    P, N, C = 30, 4, 0.5
    dp = CanaryDPFedAvg(canaries=12, noise_multiplier=0.0, clip=C, delta=1e-5)
    dp.setup_state(standalone_store(), torch.ones(N), P, torch.zeros(1, dtype=torch.float64))
    delta, _ = dp.combine(torch.zeros(N, P, dtype=torch.float64), None, _cohort(0, N, float(N), N=N))
    want = sum(C * dp.direction(i, P) for i in range(12) if dp.included[i]) / N
    assert 0 < int(dp.included.sum()) < 12
    torch.testing.assert_close(delta, want, atol=1e-15, rtol=0)
    assert torch.equal(dp.canary_rounds, dp.included.long())
    assert dp.accountant.rounds == 1
    for i in range(3):
        assert float(torch.linalg.vector_norm(dp.direction(i, P))) == pytest.approx(1.0, rel=1e-12)
    assert torch.equal(dp.direction(5, P), dp.direction(5, P)) and not torch.equal(dp.direction(5, P), dp.direction(6, P))


@pytest.mark.parametrize("kwargs, match", [
    (dict(canaries=1), "canaries: need an integer >= 2"),
    (dict(canaries=10, guesses=[6]), "guesses: 6 per side is more than half of the 10 canaries"),
    (dict(beta=1.0), "beta: must be a finite number in"),
    (dict(leak="skip"), "leak: 'skip' is not one of"),
    (dict(target_quantile=0.5), "canaries: the audit is of DP-FedAvg with a fixed clip and server noise"),
])
def test_bad_audit_settings_are_refused_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CanaryDPFedAvg(**{"noise_multiplier": 1.0, "clip": 0.5, **kwargs})


def _audit(leak, backend):
    """400 canaries beside 20 digits clients, q = 1, 5 rounds, z calibrated for ε = 2 at δ = 1e-6."""
    dp = CanaryDPFedAvg(canaries=400, leak=leak, noise_multiplier=None, target_epsilon=2.0, delta=1e-6, clip=0.5)
    m = _module(backend, algorithm="dp_fedavg", fraction=1.0, combination=dp, net=MLP(64, [64], 10))
    run_rounds(m, _digits(20), 5)
    return dp.audit()


@pytest.mark.parametrize("leak, backend", [(None, "vmap"), (None, "loop"), ("no_noise", "vmap"), ("no_noise", "loop"),
                                           ("no_clip", "vmap")])
def test_the_audit_catches_a_planted_leak_and_a_correct_run_stays_under_its_epsilon(leak, backend):
    """The same run (claimed ε = 2.0) three ways. Correct: ε_lower ≤ ε (Theorem 5.2 at 95%: a violation here would
    mean the mechanism is not (ε, δ)-DP). Noise skipped but accounted, or the canaries not clipped: every guess right
    and ε_lower = 3.88, nearly twice the ε the accountant reports."""
    result = _audit(leak, backend)
    assert result.epsilon == pytest.approx(2.0, abs=0.01) and result.delta == 1e-6 and result.m == 400
    if leak is None:
        assert result.epsilon_lower <= result.epsilon
    else:
        assert result.v == result.r == 200
        assert result.epsilon_lower > 1.9 * result.epsilon
