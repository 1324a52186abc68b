"""FedBN (SPEC §11): normalization parameters and running statistics local, everything else FedAvg's; two rounds
against an independent per-client autograd computation, on both backends
(running statistics too: each client's its own row under vmap, in every placement);
its evaluation with each client's own statistics; errors."""

from __future__ import annotations

import pytest
import torch
from conftest import flat_weights, run_rounds
from test_objectives import CLIENT_ROWS, Recorder, X, Y, toy_data
from torch import nn
from torch.func import functional_call

from lfed.lightning.module import FederatedModule

TOL = dict(atol=1e-12, rtol=0)


def bn_net(track: bool):
    """BatchNorm with running statistics (``track``), or LayerNorm: a norm without statistics."""
    torch.manual_seed(0)
    norm = nn.BatchNorm1d(3) if track else nn.LayerNorm(3)
    return nn.Sequential(nn.Linear(2, 3), norm, nn.Tanh(), nn.Linear(3, 3)).double()


def fedbn_module(backend, track, *, training: dict | None = None, client_state="device", state_dir=None, **kwargs):
    engine = dict(backend=backend, client_state=client_state, **({"client_state_dir": str(state_dir)} if state_dir else {}))
    args = dict(algorithm="fedbn", fraction=2 / 3, training={"client_lr": 0.2, "batch_size": None, "local_steps": 2, **(training or {})},
                engine=engine, seed=4)
    args.update(kwargs)
    return FederatedModule(bn_net(track), **args)


NORM = ("1.weight", "1.bias")


def by_hand(rec, track, rounds, lr=0.2, steps=2):
    """Each cohort client from the shared weights and its own norm parameters and statistics, `steps` full-batch
    SGD steps of cross-entropy with autograd (BatchNorm in training mode updates the statistics it is given)."""
    net = bn_net(track)
    shared = {n: p.detach().clone() for n, p in net.named_parameters() if n not in NORM}
    init_norm = {n: p.detach().clone() for n, p in net.named_parameters() if n in NORM}
    init_stats = {n: b.detach().clone() for n, b in net.named_buffers()}
    norm = [dict(init_norm) for _ in range(3)]
    stats = [{n: b.clone() for n, b in init_stats.items()} for _ in range(3)]
    for r in range(rounds):
        S = rec.rounds[r]["clients"]
        n = torch.tensor([len(CLIENT_ROWS[k]) for k in S], dtype=torch.float64)
        a = n / n.sum()
        deltas = []
        for k in S:
            params = {**{m: t.clone().requires_grad_() for m, t in shared.items()},
                      **{m: t.clone().requires_grad_() for m, t in norm[k].items()}}
            buffers = {m: b.clone() for m, b in stats[k].items()}
            x, y = X[CLIENT_ROWS[k]], Y[CLIENT_ROWS[k]]
            for _ in range(steps):
                loss = nn.functional.cross_entropy(functional_call(net, (params, buffers), (x,)), y)
                grads = torch.autograd.grad(loss, list(params.values()))
                params = {m: (p - lr * g).detach().requires_grad_() for (m, p), g in zip(params.items(), grads)}
            norm[k] = {m: params[m].detach() for m in NORM}
            stats[k] = buffers
            deltas.append({m: params[m].detach() - shared[m] for m in shared})
        shared = {m: shared[m] + sum(a[i] * deltas[i][m] for i in range(len(S))) for m in shared}
    return net, shared, init_norm, norm, stats


@pytest.mark.parametrize("backend, track, client_state", [("vmap", False, "device"), ("loop", False, "device"),
                                                          ("loop", True, "device"), ("vmap", True, "device"),
                                                          ("vmap", True, "host"), ("vmap", True, "disk")])
def test_fedbn_two_rounds_by_hand(backend, track, client_state, tmp_path):
    m = fedbn_module(backend, track, client_state=client_state, state_dir=tmp_path / "state" if client_state == "disk" else None)
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=2, callbacks=[rec])
    net, shared, init_norm, norm, stats = by_hand(rec, track, 2)
    got = dict(m.net.named_parameters())
    for name, value in shared.items():
        torch.testing.assert_close(got[name].detach(), value, **TOL)
    for name in NORM:  # the global model's norm parameters: the initial ones, exactly
        assert torch.equal(got[name].detach(), init_norm[name])
    seen = set(rec.rounds[0]["clients"]) | set(rec.rounds[1]["clients"])
    assert len(seen) == 3 or len(seen) == 2
    w = flat_weights(m)
    personal = m.objective.personal_rows(torch.arange(3), w, None)
    rows, buffers = personal if track else (personal, None)
    layout = m.layout
    for k in range(3):
        own = layout.unflatten(rows[k])
        for name in NORM:
            torch.testing.assert_close(own[name], norm[k][name], **TOL)
        if track:
            for name, value in stats[k].items():
                torch.testing.assert_close(buffers[name][k], value.to(buffers[name].dtype), **TOL)
    if track:  # a client's statistics really are its own: two clients that trained differ
        trained = sorted(seen)
        assert not torch.equal(buffers["1.running_mean"][trained[0]], buffers["1.running_mean"][trained[1]])


def test_fedbn_evaluation_uses_each_clients_own_statistics():
    from lfed.evaluation.scores import personal_accuracies

    m = fedbn_module("loop", True, fraction=1.0)
    run_rounds(m, toy_data(), rounds=2)
    data = m.data
    data.holdout_index = data.client_index.clone()  # score each client on its own examples (the toy has no split)
    data.holdout_sizes = data.client_sizes.clone()
    clients = torch.arange(3)
    w = flat_weights(m)
    got = personal_accuracies(m.net, m.layout, data, clients, lambda c: m.objective.personal_rows(c, w, None), chunk=2)
    rows, buffers = m.objective.personal_rows(clients, w, None)
    m.net.eval()
    for k in range(3):
        idx = data.client_index[k, : int(data.client_sizes[k])]
        own = {**dict(m.net.named_buffers()), **{n: b[k] for n, b in buffers.items()}}
        pred = functional_call(m.net, (m.layout.unflatten(rows[k]), own), (data.train_x[idx],)).argmax(-1)
        assert float(got[k]) == float((pred == data.train_y[idx]).double().mean())


def test_fedbn_on_a_net_without_norm_layers_is_refused_before_round_0():
    net = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 3)).double()
    m = FederatedModule(net, algorithm="fedbn", fraction=1.0, training=dict(batch_size=None, local_steps=1))
    with pytest.raises(ValueError, match="objective: FedBN keeps the normalization layers local, but the net .* has no"):
        run_rounds(m, toy_data(), rounds=1)
    assert m.rounds_done == 0


def test_fedbn_with_running_statistics_trains_on_the_vmap_backend():
    # 0.4 refused this (naming backend='loop'); now the engine chooses vmap for a BatchNorm net, and the statistics
    # of each client equal the loop backend's (two rounds by hand above, on both)
    m = fedbn_module("auto", True)
    run_rounds(m, toy_data(), rounds=1)
    assert m.engine.backend == "vmap"
