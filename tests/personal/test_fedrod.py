"""FedRoD (SPEC §11; Chen & Chao 2022): per local step θ, ψ ← θ, ψ − η∇ BSM (cross-entropy on G(z) + log n_k), and
φ_k ← φ_k − η∇_φ CE(sg[G(z)] + P_k(sg[z])), simultaneously; the personalized model is the net with the head
ψ + φ_k. Two rounds by hand (plain torch autograd, float64) on both backends, with partial participation,
stragglers and a client missing a class; errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import flat_weights, run_rounds
from test_objectives import BACKENDS, CLIENT_ROWS, Recorder, X, Y, toy_data
from torch import nn

from lfed.base.declaration import declaration
from lfed.lightning.module import FederatedModule
from lfed.personal.fedrod import FedRoD

TOL = dict(atol=1e-12, rtol=0)
SIZES = [2, 3, 4]
C = 3


def make_net():
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, C)).double()


def module(backend, objective=None, *, training: dict | None = None, stragglers: dict | None = None, **kwargs):
    args = dict(algorithm="fedrod", objective=objective, fraction=2 / 3,
                training={"client_lr": 0.5, "batch_size": None, "local_steps": 3, **(training or {})},
                stragglers={"p_incomplete": 0.6, **(stragglers or {})}, engine=dict(backend=backend), seed=7)
    args.update(kwargs)
    return FederatedModule(make_net(), **args)


def unpack(w):
    """The flat vector as (W1 [3, 2], b1 [3], W2 [3, 3], b2 [3])."""
    return w[:6].view(3, 2), w[6:9], w[9:18].view(3, 3), w[18:21]


def fedrod_by_hand(rec, rounds, w0, lr=0.5, prior=True):
    w, phi = w0.clone(), [torch.zeros(12, dtype=torch.float64) for _ in range(3)]
    for r in range(rounds):
        ends = []
        for k, s in zip(rec.rounds[r]["clients"], rec.rounds[r]["steps"]):
            x, y = X[CLIENT_ROWS[k]], Y[CLIENT_ROWS[k]]
            n = torch.bincount(y, minlength=C).double()  # client 0 has no class 2: log 0 = −∞
            theta, p = w.clone(), phi[k].clone()
            for _ in range(s):
                params = [t.clone().requires_grad_() for t in unpack(theta)]
                W1, b1, W2, b2 = params
                z = torch.tanh(x @ W1.T + b1)
                generic = z @ W2.T + b2
                bsm = F.cross_entropy(generic + (n.log() if prior else 0), y)
                grads = torch.autograd.grad(bsm, params)
                U, c = p[:9].view(3, 3).clone().requires_grad_(), p[9:].clone().requires_grad_()
                personal = F.cross_entropy(generic.detach() + z.detach() @ U.T + c, y)
                gU, gc = torch.autograd.grad(personal, [U, c])
                theta = theta - lr * torch.cat([g.reshape(-1) for g in grads])
                p = p - lr * torch.cat([gU.reshape(-1), gc])
            if s > 0:
                phi[k] = p
            ends.append(theta)
        sizes = [SIZES[k] for k in rec.rounds[r]["clients"]]
        w = w + sum(nk / sum(sizes) * (e - w) for nk, e in zip(sizes, ends))
    return w, phi


@pytest.mark.parametrize("backend", BACKENDS)
def test_fedrod_two_rounds_by_hand(backend):
    m = module(backend)
    w0 = flat_weights(m).clone()
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=2, callbacks=[rec])
    steps = [s for r in rec.rounds for s in r["steps"]]
    assert any(0 < s < 3 for s in steps) and 3 in steps
    assert 0 in [k for r in rec.rounds for k in r["clients"]]  # the client without class 2 takes part
    w, phi = fedrod_by_hand(rec, 2, w0)
    torch.testing.assert_close(flat_weights(m), w, **TOL)
    clients = torch.arange(3)
    torch.testing.assert_close(m.objective.rows("personal_head", clients), torch.stack(phi), **TOL)
    no_prior, _ = fedrod_by_hand(rec, 2, w0, prior=False)
    assert (no_prior - w).abs().max() > 1e-3  # the balanced softmax's prior matters here
    # the personalized model: its logits are the generic logits plus the personal head's, on every client's data
    rows = m.objective.personal_rows(clients, w, None)
    W1, b1, W2, b2 = unpack(w)
    for k in range(3):
        z = torch.tanh(X @ W1.T + b1)
        by_hand = (z @ W2.T + b2) + (z @ phi[k][:9].view(3, 3).T + phi[k][9:])
        got = torch.func.functional_call(m.net, m.layout.unflatten(rows[k]), (X,))
        torch.testing.assert_close(got, by_hand, **TOL)


def test_the_head_is_named_or_the_last_linear_layer():
    net = make_net()
    from lfed.engine.params import ParamLayout

    layout = ParamLayout.from_module(net)
    rod = FedRoD()
    rod.make_sharing(net, layout)
    assert rod._index.tolist() == list(range(9, 21)) and rod.num_classes == 3
    named = FedRoD(head="2")
    named.make_sharing(net, layout)
    assert named._index.tolist() == list(range(9, 21))
    with pytest.raises(ValueError, match="head: FedRoD's heads are linear .*'1' is a Tanh"):
        FedRoD(head="1").make_sharing(net, layout)
    with pytest.raises(ValueError, match="head: 'fc' is not a submodule of the net; its nn.Linear submodules: \\['0', '2'\\]"):
        FedRoD(head="fc").make_sharing(net, layout)
    with pytest.raises(ValueError, match="head: give the name"):
        FedRoD(head="")


def test_a_bad_head_or_loss_stops_the_run_before_anything_is_written():
    m = module("vmap", objective=FedRoD(head="1"))
    with pytest.raises(ValueError, match="head: FedRoD's heads are linear"):
        run_rounds(m, toy_data(), rounds=1)
    assert m.rounds_done == 0
    m = module("vmap", loss=lambda out, y: (out[:, 0] - y.double()) ** 2)
    with pytest.raises(ValueError, match="loss: FedRoD's losses are the balanced softmax"):
        run_rounds(m, toy_data(), rounds=1)
    assert m.rounds_done == 0


def test_the_preset_is_fedrod():
    m = FederatedModule(torch.nn.Linear(2, 3), algorithm="fedrod")
    assert type(m.objective) is FedRoD and declaration(m.objective).supports.personalized


def test_fedrod_in_a_run_logs_personal_accuracies():
    from test_evaluation import classification_data, classification_module

    m = classification_module(FedRoD())
    trainer = run_rounds(m, classification_data(), rounds=2, evaluate_every=2)
    assert {"personal/acc_mean", "global/acc_mean"} <= set(trainer.logged_metrics)
