"""The one-run audit of example-level DP-SGD (lfed.privacy.audit_examples): canary examples in one client, the server
as the auditor. A correct run's ε_lower stays below the canary client's ε; each planted leak is caught (ε_lower > ε)."""

from __future__ import annotations

import pytest
import torch
from conftest import run_rounds

from lfed.data.datasets import load_dataset
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.models.zoo import MLP
from lfed.privacy.audit_examples import CanaryDPSGD


def _audited(leak):
    """Digits over 50 IID clients (~36 examples each), all in every round, 5 rounds of 20 DP-SGD steps (B = 4, σ = 4,
    C = 1): the canary client takes 100 steps; 1,000 canaries."""
    ds = load_dataset("digits")
    data = FederatedDataModule.from_tensors(ds.train_x, ds.train_y, ds.test_x, ds.test_y, num_clients=50,
                                            partition="iid", seed=0)
    torch.manual_seed(0)
    dp = CanaryDPSGD(canaries=1000, leak=leak, noise_multiplier=4.0, clip=1.0, delta=1e-5)
    m = FederatedModule(MLP(64, [100], 10), objective=dp, fraction=1.0,
                        training=dict(client_lr=0.1, batch_size=4, local_steps=20), seed=0)
    run_rounds(m, data, 5, precision="32-true")
    return dp, dp.audit(), int(m.runs[0].data.client_sizes[0])


def test_a_correct_run_is_not_refuted_and_its_canaries_were_sampled_at_the_clients_rate():
    dp, result, n = _audited(None)
    assert 0 < result.epsilon < 3
    assert result.epsilon_lower <= result.epsilon
    steps = float(dp.steps[0])
    assert steps == 100
    draws = dp.included.sum() * steps  # each included canary, sampled at q_k = B / n_k in each of the 100 steps
    rate, q = float(dp.sampled.sum()) / float(draws), min(1.0, 4 / n)
    assert abs(rate - q) < 4 * (q * (1 - q) / float(draws)) ** 0.5
    assert int(dp.sampled[~dp.included].sum()) == 0  # an excluded canary is never in a batch


@pytest.mark.parametrize("leak", ["no_noise", "no_clip"])
def test_a_planted_leak_is_caught(leak):
    _, result, _ = _audited(leak)
    assert result.epsilon_lower > result.epsilon, (leak, result)


def test_bad_audit_settings_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="leak: 'skip' is not one of"):
        CanaryDPSGD(leak="skip")
    with pytest.raises(ValueError, match="guesses: 6 per side is more than half of the 10 canaries"):
        CanaryDPSGD(canaries=10, guesses=[6])
    with pytest.raises(ValueError, match="canaries"):
        CanaryDPSGD(canaries=1)


def test_an_audit_whose_canary_client_never_took_part_says_so_in_one_line():
    """The auditor sees the canary client's uploads only: if it was never sampled there is nothing to score, and the
    refusal names canary_client and what to change (it read "no round has run" before)."""
    from lfed.privacy.audit_examples import CanaryDPSGD

    dp = CanaryDPSGD(canaries=10, canary_client=3, noise_multiplier=1.0, clip=1.0)
    with pytest.raises(RuntimeError, match=r"^canary_client: client 3 took part in no round of this run, so the auditor "
                                           r"saw none of its uploads; choose a canary_client that takes part"):
        dp.scores()
