"""Ditto built in (lfed.personal.ditto, SPEC §11): partial participation and stragglers by hand on both backends,
its preset, and the personalized model each evaluation scores."""

from __future__ import annotations

import pytest
import torch
from conftest import flat_weights, run_rounds
from test_objectives import BACKENDS, W_INIT, Recorder, grad, toy_data, toy_module

from lfed.base.declaration import Declaration, Supports, declaration
from lfed.client.objectives import ClientRule
from lfed.lightning.module import FederatedModule
from lfed.personal.ditto import Ditto

TOL = dict(atol=1e-13, rtol=0)
SIZES = [2, 3, 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_ditto_with_partial_participation_and_stragglers_by_hand(backend):
    lam, lr = 0.7, 0.1
    m = toy_module(Ditto(lam=lam), backend, fraction=2 / 3, training=dict(local_steps=3), stragglers=dict(p_incomplete=0.6), seed=7)
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=3, callbacks=[rec])
    assert any(s < 3 for r in rec.rounds for s in r["steps"])
    w, v = W_INIT.clone(), [None] * 3
    for r in range(3):
        S, steps = rec.rounds[r]["clients"], rec.rounds[r]["steps"]
        ends = []
        for k, s in zip(S, steps):
            y = w.clone()
            p = w.clone() if v[k] is None else v[k]
            for _ in range(s):
                y = y - lr * grad(y, k)
                p = p - lr * (grad(p, k) + lam * (p - w))  # v ← v − η(∇F_k(v) + λ(v − w^r)), s_k steps
            if s > 0:
                v[k] = p
            ends.append(y)
        n = [SIZES[k] for k in S]
        w = w + sum(nk / sum(n) * (e - w) for nk, e in zip(n, ends))
    torch.testing.assert_close(flat_weights(m), w, **TOL)
    got = m.objective.personal_rows(torch.arange(3), w, None)
    for k in range(3):
        torch.testing.assert_close(got[k], w if v[k] is None else v[k], **TOL)


def test_the_presets_name_the_personal_rules():
    from lfed.personal.apfl import APFL
    from lfed.personal.fedbn import FedBN
    from lfed.personal.fedper import FedPer
    from lfed.personal.fedrep import FedRep
    from lfed.personal.finetune import FedAvgFT

    for name, cls in {"ditto": Ditto, "fedavg_ft": FedAvgFT, "fedper": FedPer, "fedrep": FedRep, "fedbn": FedBN,
                      "apfl": APFL}.items():
        m = FederatedModule(torch.nn.Linear(2, 3), algorithm=name)
        assert type(m.objective) is cls and declaration(m.objective).supports.personalized, name


def test_a_rule_that_says_personalized_without_personal_rows_is_refused_before_round_0():
    class Vague(ClientRule):
        declares = Declaration(supports=Supports(personalized=True))

    m = toy_module(Vague(), "vmap")
    with pytest.raises(ValueError, match="objective: Vague says it is personalized but does not say what"):
        run_rounds(m, toy_data(), rounds=1)


@pytest.mark.parametrize("lam", [-0.1, float("nan")])
def test_ditto_bad_lambda(lam):
    with pytest.raises(ValueError, match="lam"):
        Ditto(lam=lam)
