"""Per-FedAvg (SPEC §11; Fallah, Mokhtari, Ozdaglar 2020, Algorithm 1): per local step w̃ = w − α∇f(w),
w ← w − β∇f(w̃) (FO), w ← w − β(∇f(w̃) − α[∇f(w + δg) − ∇f(w − δg)]/(2δ)) (HF); two rounds by hand on both
backends with partial participation and stragglers; the personalized model (steps of size α from w); resume."""

from __future__ import annotations

import pytest
import torch
from conftest import flat_weights, run_rounds
from test_objectives import BACKENDS, CLIENT_ROWS, W_INIT, Recorder, X, grad, per_example_grads, toy_data, toy_module

from lfed.base.declaration import declaration
from lfed.engine.ranks import Ranks
from lfed.lightning.module import FederatedModule
from lfed.personal.perfedavg import PerFedAvg

TOL = dict(atol=1e-12, rtol=0)
SIZES = [2, 3, 4]


def hessian(k):
    """``∇²f_k = (2/n_k) Σ_i x_i x_iᵀ`` of the toy squared loss (constant: the gradient is linear in w)."""
    x = X[CLIENT_ROWS[k]]
    return 2 * x.T @ x / len(CLIENT_ROWS[k])


def perfedavg_by_hand(rec, rounds, alpha, beta, variant, delta):
    """Algorithm 1 literally, full batch (D = D' = D'' = the client's data), size-weighted FedAvg of the models."""
    w = W_INIT.clone()
    for r in range(rounds):
        ends = []
        for k, s in zip(rec.rounds[r]["clients"], rec.rounds[r]["steps"]):
            y = w.clone()
            for _ in range(s):
                w_tilde = y - alpha * grad(y, k)
                g = grad(w_tilde, k)
                if variant == "hf":
                    d = (grad(y + delta * g, k) - grad(y - delta * g, k)) / (2 * delta)
                    torch.testing.assert_close(d, hessian(k) @ g, atol=1e-10, rtol=0)  # the HVP it estimates
                    g = g - alpha * d
                y = y - beta * g
            ends.append(y)
        n = [SIZES[k] for k in rec.rounds[r]["clients"]]
        w = w + sum(nk / sum(n) * (e - w) for nk, e in zip(n, ends))
    return w


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_two_rounds_by_hand(backend, variant):
    alpha, beta, delta = 0.3, 0.1, 1e-3
    m = toy_module(PerFedAvg(alpha=alpha, variant=variant, delta=delta), backend, fraction=2 / 3, training=dict(local_steps=3, client_lr=beta),
                   stragglers=dict(p_incomplete=0.6), seed=7)
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=2, callbacks=[rec])
    assert any(s < 3 for r in rec.rounds for s in r["steps"]) and any(s == 3 for r in rec.rounds for s in r["steps"])
    w = perfedavg_by_hand(rec, 2, alpha, beta, variant, delta)
    torch.testing.assert_close(flat_weights(m), w, **TOL)
    other = perfedavg_by_hand(rec, 2, alpha, beta, "fo" if variant == "hf" else "hf", delta)
    assert (other - w).abs().max() > 1e-4  # the Hessian term matters here: the test tells the variants apart


@pytest.mark.parametrize("backend", BACKENDS)
def test_perfedavg_hf_draws_three_independent_batches_a_step(backend):
    """Batch size 1: D_t is the round's own batch, D'_t and D''_t come from the streams "perfedavg_outer" and
    "perfedavg_hessian" (the schedule is lfed's seeded draw; the maths by hand on the drawn examples)."""
    from lfed.engine import batch_schedule
    from lfed.rng import round_generator

    alpha, beta, delta, T, seed = 0.3, 0.1, 1e-3, 3, 5
    m = toy_module(PerFedAvg(alpha=alpha, variant="hf", delta=delta), backend, training=dict(batch_size=1, local_steps=T, client_lr=beta),
                   seed=seed)
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=1, callbacks=[rec])
    S = rec.rounds[0]["clients"]
    n = torch.tensor([SIZES[k] for k in S])
    batches = {s: batch_schedule(n, T, 1, round_generator(seed, 0, s))[0][:, :, 0]
               for s in ("batches", "perfedavg_outer", "perfedavg_hessian")}
    assert not torch.equal(batches["perfedavg_outer"], batches["perfedavg_hessian"])
    ends = []
    for i, k in enumerate(S):
        def g1(v, stream, t, k=k, i=i):  # the gradient on one drawn example
            return per_example_grads(v, k)[batches[stream][i, t]]

        y = W_INIT.clone()
        for t in range(T):
            w_tilde = y - alpha * g1(y, "batches", t)
            g = g1(w_tilde, "perfedavg_outer", t)
            d = (g1(y + delta * g, "perfedavg_hessian", t) - g1(y - delta * g, "perfedavg_hessian", t)) / (2 * delta)
            y = y - beta * (g - alpha * d)
        ends.append(y)
    w = W_INIT + sum(nk / sum(SIZES) * (e - W_INIT) for nk, e in zip([SIZES[k] for k in S], ends))
    torch.testing.assert_close(flat_weights(m), w, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("eval_steps", [1, 2])
def test_perfedavg_personalized_model_is_steps_of_size_alpha_from_w(backend, eval_steps):
    alpha = 0.3
    m = toy_module(PerFedAvg(alpha=alpha, eval_steps=eval_steps), backend)
    run_rounds(m, toy_data(), rounds=1)
    w = flat_weights(m)
    clients = torch.tensor([2, 0, 1])
    got = m.objective.personal_rows(clients, w, m.runs[0].local_work(clients, Ranks()))
    for i, k in enumerate(clients.tolist()):
        v = w.clone()
        for _ in range(eval_steps):
            v = v - alpha * grad(v, k)
        torch.testing.assert_close(got[i], v, **TOL)


def test_perfedavg_in_a_run_logs_personal_accuracies():
    from test_evaluation import classification_data, classification_module

    m = classification_module(PerFedAvg(alpha=0.05, variant="hf"))
    trainer = run_rounds(m, classification_data(), rounds=2, evaluate_every=2)
    assert {"personal/acc_mean", "global/acc_mean"} <= set(trainer.logged_metrics)


def test_the_preset_is_perfedavg():
    m = FederatedModule(torch.nn.Linear(2, 3), algorithm="perfedavg")
    assert type(m.objective) is PerFedAvg and declaration(m.objective).supports.personalized


@pytest.mark.parametrize("kwargs, match", [({"alpha": 0.0}, "alpha"), ({"alpha": float("nan")}, "alpha"),
                                           ({"variant": "so"}, "variant: 'so' is not one of \\('fo', 'hf'\\)"),
                                           ({"delta": 0.0}, "delta"), ({"eval_steps": 0}, "eval_steps")])
def test_perfedavg_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PerFedAvg(**kwargs)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_resume_is_bit_identical(variant, tmp_path):
    """Stopped after round 2 and resumed to 4 (mini-batches, stragglers): the same model as 4 rounds straight,
    bit for bit, and the same personalized models (Per-FedAvg keeps no per-client state)."""
    from test_sharing import resume_data, resume_module, trainer

    def make():
        return PerFedAvg(alpha=0.2, variant=variant)

    straight = resume_module(make(), "device", tmp_path)
    run_rounds(straight, resume_data(), rounds=4, default_root_dir=tmp_path)
    a = resume_module(make(), "device", tmp_path)
    t = trainer(tmp_path, 2)
    t.fit(a, datamodule=resume_data())
    t.save_checkpoint(tmp_path / "r2.ckpt")
    b = resume_module(make(), "host", tmp_path)
    trainer(tmp_path, 4).fit(b, datamodule=resume_data(), ckpt_path=tmp_path / "r2.ckpt")
    assert torch.equal(flat_weights(b), flat_weights(straight))
    assert not torch.equal(flat_weights(b), flat_weights(a))
    clients = torch.arange(6)
    rows = [m.objective.personal_rows(clients, flat_weights(m), m.runs[0].local_work(clients, Ranks()))
            for m in (straight, b)]
    assert torch.equal(rows[0], rows[1])
