"""APFL (SPEC §11): per step w ← w − η∇F(w), v ← v − η α ∇F(v̄), α ← clip(α − η_α⟨v − w, ∇F(v̄)⟩) from the
step's values; two rounds by hand on both backends, with the clip active; stragglers; the personalized model."""

from __future__ import annotations

import pytest
import torch
from conftest import flat_weights, run_rounds
from test_objectives import BACKENDS, W_INIT, Recorder, grad, toy_data, toy_module

from lfed.personal.apfl import APFL

TOL = dict(atol=1e-12, rtol=0)
SIZES = [2, 3, 4]


def apfl_by_hand(rec, rounds, alpha, alpha_lr, lr=0.1):
    w = W_INIT.clone()
    v = [None] * 3
    a = [torch.tensor(alpha, dtype=torch.float64) for _ in range(3)]
    clipped = False
    for r in range(rounds):
        S, steps = rec.rounds[r]["clients"], rec.rounds[r]["steps"]
        ends = []
        for k, s in zip(S, steps):
            wk = w.clone()
            vk = w.clone() if v[k] is None else v[k]
            ak = a[k]
            for _ in range(s):
                mix = ak * vk + (1 - ak) * wk
                g = grad(mix, k)
                raw = ak - alpha_lr * torch.dot(vk - wk, g)
                clipped |= bool(raw < 0 or raw > 1)
                vk, ak, wk = vk - lr * ak * g, raw.clamp(0, 1), wk - lr * grad(wk, k)
            if s > 0:
                v[k], a[k] = vk, ak
            ends.append(wk)
        n = [SIZES[k] for k in S]
        w = w + sum(nk / sum(n) * (e - w) for nk, e in zip(n, ends))
    return w, v, a, clipped


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("alpha, alpha_lr", [(0.5, 0.3), (0.9, 50.0)])
def test_apfl_two_rounds_by_hand(backend, alpha, alpha_lr):
    m = toy_module(APFL(alpha=alpha, alpha_lr=alpha_lr), backend, fraction=2 / 3)
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=2, callbacks=[rec])
    w, v, a, clipped = apfl_by_hand(rec, 2, alpha, alpha_lr)
    assert clipped == (alpha_lr == 50.0)  # the second case exercises the clip to [0, 1]
    torch.testing.assert_close(flat_weights(m), w, **TOL)
    clients = torch.arange(3)
    nan = torch.full((2,), float("nan"), dtype=torch.float64)
    rows, mix = m.objective.rows("personal", clients, first=nan), m.objective.rows("mix", clients)
    for k in range(3):
        if v[k] is None:  # never took part: α at its initial value, no personal model yet
            assert torch.isnan(rows[k]).all() and float(mix[k]) == alpha
            continue
        torch.testing.assert_close(rows[k], v[k], **TOL)
        torch.testing.assert_close(mix[k], a[k], **TOL)
    personal = m.objective.personal_rows(clients, w, None)
    for k in range(3):
        vk, ak = (w, torch.tensor(alpha, dtype=torch.float64)) if v[k] is None else (v[k], a[k])
        torch.testing.assert_close(personal[k], ak * vk + (1 - ak) * w, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_apfl_with_stragglers_by_hand(backend):
    m = toy_module(APFL(alpha=0.4, alpha_lr=0.5), backend, fraction=1.0, training=dict(local_steps=3), stragglers=dict(p_incomplete=0.7),
                   seed=5)
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=2, callbacks=[rec])
    assert any(s < 3 for r in rec.rounds for s in r["steps"])
    w, v, a, _ = apfl_by_hand(rec, 2, 0.4, 0.5)
    torch.testing.assert_close(flat_weights(m), w, **TOL)
    torch.testing.assert_close(m.objective.rows("mix", torch.arange(3)), torch.stack(a), **TOL)


@pytest.mark.parametrize("kwargs, match", [({"alpha": 1.5}, "alpha"), ({"alpha": -0.1}, "alpha"),
                                           ({"alpha_lr": -1.0}, "alpha_lr")])
def test_apfl_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        APFL(**kwargs)
