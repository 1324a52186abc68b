"""Objectives that change the loss (MOON, Ditto): a client rule's ``loss_term`` under vmap and loop.

FedProx written as a loss term, ``(μ/2)||w - w_start||²`` added to each example's loss, has the
gradient ``μ (w - w_start)``: exactly FedProx's step rule (SPEC §2 prox). So the two spellings must
train the same weights (to float64 round-off: autograd computes ``μ(w - w0)``, the rule ``μw - μw0``)
on both backends, with the toy problem of tests/client/test_objectives.py. A per-example term is
checked by hand on one step of one client.
"""

from __future__ import annotations

import pytest
import torch
from conftest import run_rounds
from lightning.pytorch import Callback
from test_objectives import BACKENDS, Recorder, fit, toy_data, toy_module
from torch import nn

from lfed.client.objectives import EFL, ClientRule, Prox
from lfed.engine import CohortTrainer, LossTerm, StepRule


class ProxAsLoss(ClientRule):
    """FedProx through the loss: ``(μ/2)||w - w_start||²`` for every example."""

    name = "prox_as_loss"

    def __init__(self, mu: float) -> None:
        super().__init__()
        self.mu = mu

    def loss_term(self, cohort, w_start):
        K = cohort.clients.numel()

        def prox(params, out, x, y, w0):
            w = torch.cat([p.reshape(-1) for p in params.values()])
            return 0.5 * self.mu * (w - w0).square().sum()  # one value for the batch: added to each example

        return LossTerm(prox, w_start.expand(K, -1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_prox_as_a_loss_term_trains_as_the_prox_step_rule(backend):
    kwargs = dict(training=dict(client_lr=0.1, local_steps=3), fraction=2 / 3, stragglers=dict(p_inactive=0.3), seed=4)
    by_rule = fit(toy_module(Prox(0.5), backend, **kwargs), rounds=2)
    by_loss = fit(toy_module(ProxAsLoss(0.5), backend, **kwargs), rounds=2)
    plain = fit(toy_module(None, backend, **kwargs), rounds=2)
    for a, b in zip(by_rule.states, by_loss.states):
        torch.testing.assert_close(b["w"], a["w"], atol=1e-12, rtol=0)
    assert not torch.allclose(plain.states[-1]["w"], by_loss.states[-1]["w"], atol=1e-6)  # the term does act


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_per_example_term_by_hand(backend):
    """One client, one full-batch step; term_i = c * out_i (per example), so g = g_loss + c * mean_i x_i."""
    net = nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[0.5, -1.0]], dtype=torch.float64))
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([[1.0], [0.0], [2.0]], dtype=torch.float64)

    def loss(out, t):
        return (out - t).square().reshape(-1)

    trainer = CohortTrainer(net, loss, backend=backend)
    w0 = trainer.layout.module_vector(net)
    c = torch.tensor([[0.7], [-0.2]], dtype=torch.float64)  # per-client coefficient (2 clients, aux rows)
    term = LossTerm(lambda params, out, xb, yb, ck: ck[0] * out.reshape(-1), c)
    index = torch.tensor([[0, 1, 2], [0, 1, 2]])
    n = torch.tensor([3, 3])
    res = trainer.train(w0, x, y, index, n, torch.tensor([1, 1]), StepRule(loss_term=term), 0.1, None,
                        torch.Generator().manual_seed(0))
    residual = x @ w0 - y.reshape(-1)
    g_loss = (2 * residual[:, None] * x).mean(0)
    for k in range(2):
        expected = w0 - 0.1 * (g_loss + c[k, 0] * x.mean(0))
        torch.testing.assert_close(res.weights[k], expected, atol=1e-14, rtol=0)


def test_loss_term_rows_follow_the_cohort():
    term = LossTerm(lambda *a: 0.0, {"a": torch.arange(4.0)[:, None], "b": torch.arange(4.0)})
    sub = StepRule(loss_term=term).select(torch.tensor([2, 0]), 4).loss_term
    assert sub.aux["a"].reshape(-1).tolist() == [2.0, 0.0] and sub.aux["b"].tolist() == [2.0, 0.0]
    with pytest.raises(ValueError, match="aux has 4 rows for a cohort of 3"):
        term.select(torch.tensor([0]), 3)


class _MetricLog(Callback):
    def __init__(self, key):
        self.key, self.values = key, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.values.append(float(trainer.callback_metrics[self.key]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_efl_logs_max_lr_lambda_u_of_the_state_each_round_steps_with(backend):
    """SPEC §2 efl: log max_i η λ U_i every round (the step is stable only below 2), U before the round's reports."""
    lr, lam = 0.1, 3.0
    module = toy_module(EFL(lam, fisher_samples=4), backend, training=dict(client_lr=lr, local_steps=2), fraction=2 / 3, seed=2)
    log = _MetricLog("efl/max_lr_lambda_u")
    rec = Recorder(module)
    run_rounds(module, toy_data(), rounds=3, callbacks=[rec, log])
    expected = [lr * lam * float(state["objective.fisher_u_sum"].max()) for state in rec.states[:3]]
    assert expected[0] == 0.0 and expected[2] > 0  # no reports before round 0; U grows as clients report
    assert log.values == pytest.approx(expected, rel=1e-12, abs=0)
