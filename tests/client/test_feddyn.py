"""FedDyn (SPEC §2 feddyn), the one-file algorithm (lfed/client/feddyn.py), worked by hand.

The toy problem of tests/client/test_objectives.py: a bias-free linear regression ``w·x``
(P = 2) with the squared loss on three clients of 2, 3 and 4 examples, full-batch local steps,
float64, both backends. Written out from SPEC §2 with plain tensor arithmetic:

* client k: ``y ← y - η (g_k(y) - h_k + α (y - w))`` for its ``s_k`` steps; ``Δ_k = y - w``;
* for each client whose work counts: ``h_k ← h_k - α Δ_k``;
* server: ``h ← h - (α/N) Σ_{k counting} Δ_k``, ``Δ = mean_{k counting} Δ_k - h/α``, ``w ← w + Δ``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import REPO
from test_objectives import BACKENDS, TOL, W_INIT, N, fit, grad, toy_module

from lfed.client.feddyn import FedDyn
from lfed.lightning.cli import run_cli


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p_inactive", [0.0, 0.5])
def test_feddyn_two_rounds_by_hand(backend, p_inactive):
    lr, alpha, T = 0.1, 0.3, 3
    module = toy_module(FedDyn(alpha), backend, training=dict(client_lr=lr, local_steps=T), fraction=2 / 3,
                        stragglers=dict(p_inactive=p_inactive), seed=1)
    assert module.combination is module.objective  # FedDyn brings its own server combination
    rec = fit(module, rounds=2)
    w, h, hk = W_INIT.clone(), torch.zeros(2, dtype=torch.float64), torch.zeros(N, 2, dtype=torch.float64)
    inactive = 0
    for r, rnd in enumerate(rec.rounds):
        S, steps = rnd["clients"], rnd["steps"]
        assert len(S) == 2 and all(s in (0, T) for s in steps)
        deltas = {}
        for k, K in zip(S, steps):
            if K == 0:  # inactive: no work, no state change (SPEC §2)
                inactive += 1
                continue
            y = w.clone()
            for _ in range(K):
                y = y - lr * (grad(y, k) - hk[k] + alpha * (y - w))
            deltas[k] = y - w
        state = rec.states[r + 1]
        if not deltas:  # a skipped round
            torch.testing.assert_close(state["w"], w, **TOL)
            continue
        for k, d in deltas.items():
            hk[k] = hk[k] - alpha * d
        h = h - (alpha / N) * sum(deltas.values())
        w = w + sum(deltas.values()) / len(deltas) - h / alpha
        torch.testing.assert_close(state["w"], w, **TOL)
        torch.testing.assert_close(state["objective.h"], h, **TOL)
        torch.testing.assert_close(state["objective.h_client"], hk, **TOL)
    assert "combination.h" not in rec.states[-1]  # one component in two roles is saved once
    assert h.abs().min() > 1e-4 and (hk != 0).any(dim=1).sum() >= (2 if p_inactive == 0 else 1)
    assert (inactive > 0) == (p_inactive > 0)


def test_feddyn_refuses_a_bad_alpha_and_another_combination():
    with pytest.raises(ValueError, match=r"alpha: must be a finite number > 0 \(FedDyn's coefficient\)"):
        FedDyn(alpha=0.0)
    with pytest.raises(ValueError, match="combination: objective 'feddyn' brings its own server combination"):
        toy_module(None, "vmap", algorithm="feddyn", combination="self")


def test_feddyn_from_the_quickstart_config(tmp_path):
    """``lfed fit --config configs/quickstart.yaml --model.algorithm=feddyn`` runs and fills FedDyn's state."""
    cli = run_cli(["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--model.algorithm=feddyn",
                   "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.logger=false",
                   "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"])
    m = cli.model
    assert isinstance(m.objective, FedDyn) and m.combination is m.objective and cli.trainer.global_step == 2
    assert m.objective.h.abs().sum() > 0 and m.objective.h_client.abs().sum(1).gt(0).sum() >= 5
    assert torch.isfinite(m.layout.module_vector(m.net)).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_feddyn_moves_h_k_of_the_counting_clients_only_not_a_dropped_straggler(backend):
    """Issue 67 (Acar et al. 2021): h_k moves only for the clients whose update the server uses. Under
    ``partial_work: drop`` a straggler trained (it is active) but does not count: its h_k stays 0, and when it next
    takes part its local objective has no linear term. Through run_round on a fixed cohort, by hand in float64.

    Round 0: clients [0, 1, 2] of budget T = 3 complete [3, 1, 3] steps; client 1 is dropped. Round 1: clients
    [1, 2] complete [3, 3]."""
    from test_round import _setup

    from lfed.core.algorithm import LocalTraining
    from lfed.core.round import run_round

    lr, alpha, T = 0.1, 0.3, 3
    alg, _, data, engine = _setup(backend, algorithm="fedavg", objective=FedDyn(alpha), partial_work="drop")
    assert alg.combination is alg.objective
    plan = LocalTraining(client_lr=lr, batch_size=None, local_steps=T)
    w, h, hk = W_INIT.clone(), torch.zeros(2, dtype=torch.float64), torch.zeros(N, 2, dtype=torch.float64)

    def local(w, k, steps):  # y <- y - η (g_k(y) - h_k + α (y - w))
        y = w.clone()
        for _ in range(steps):
            y = y - lr * (grad(y, k) - hk[k] + alpha * (y - w))
        return y - w

    w_got = W_INIT.clone()
    for r, (S, steps) in enumerate([([0, 1, 2], [3, 1, 3]), ([1, 2], [3, 3])]):
        w_got, rec = run_round(alg, w_got, data, plan, engine, round=r, clients=torch.tensor(S),
                               steps_done=torch.tensor(steps))
        counting = [k for k, s in zip(S, steps) if s == T]  # active and complete; client 1 in round 0 is dropped
        assert rec.cohort.counting.tolist() == [s == T for s in steps]
        assert rec.cohort.active.tolist() == [True] * len(S)
        deltas = {k: local(w, k, T) for k in counting}
        for k, d in deltas.items():  # h_k <- h_k - α Δ_k, for the counting clients only
            hk[k] = hk[k] - alpha * d
        h = h - (alpha / N) * sum(deltas.values())
        w = w + sum(deltas.values()) / len(deltas) - h / alpha
        torch.testing.assert_close(w_got, w, **TOL)
        torch.testing.assert_close(alg.objective.state("h"), h, **TOL)
        torch.testing.assert_close(alg.objective.state("h_client"), hk, **TOL)
        if r == 0:
            assert hk[1].abs().sum() == 0 and (hk[[0, 2]] != 0).all()  # the straggler's h_1 did not move
    assert (hk != 0).all()  # by round 1 every client counted once
