"""Partial sharing (SPEC §11): the local part of the model stays on each client; FedPer and FedRep by hand
over two rounds on both backends; the local part is not uploaded, compressed, counted or server-stepped;
errors; resume in every client-state placement."""

from __future__ import annotations

import pytest
import torch
from conftest import flat_weights, run_rounds
from lightning.pytorch import Trainer
from test_objectives import BACKENDS, CLIENT_ROWS, W_INIT, Recorder, X, Y, toy_data, toy_module
from torch import nn

from lfed.engine.params import ParamLayout
from lfed.personal.fedper import FedPer
from lfed.personal.fedrep import FedRep
from lfed.personal.sharing import Sharing, norm_parameter_names
from lfed.server.channel import Dense

TOL = dict(atol=1e-13, rtol=0)


def theta_grad(t, k):
    """``[3]``: the gradient of (1/n_k) Σ (w·x + b - y)² at ``t = (w1, w2, b)``."""
    x = torch.cat([X[CLIENT_ROWS[k]], torch.ones(len(CLIENT_ROWS[k]), 1, dtype=torch.float64)], 1)
    y = Y[CLIENT_ROWS[k]].double()
    return 2 * x.T @ (x @ t - y) / len(CLIENT_ROWS[k])


def size_weights(S):
    n = [len(CLIENT_ROWS[k]) for k in S]
    return [nk / sum(n) for nk in n]


# ----------------------------------------------------------------------------- the split
def layout_of(net):
    return ParamLayout.from_module(net)


def test_sharing_splits_the_flat_vector_by_parameter_names():
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))  # 0.weight 6, 0.bias 3, 2.weight 6, 2.bias 2
    s = Sharing.from_patterns(layout_of(net), ["2.*"])
    assert s.local_names == ("2.weight", "2.bias") and s.shared_names == ("0.weight", "0.bias")
    assert s.shared_sizes == [6, 3] and s.num_local == 8 and s.num_shared == 9
    x = torch.arange(17.0)
    assert s.shared(x).tolist() == list(range(9)) and s.local(x).tolist() == list(range(9, 17))
    merged = s.merge(x, torch.full((2, 8), -1.0))
    assert merged.shape == (2, 17) and merged[:, :9].equal(x[:9].expand(2, 9)) and (merged[:, 9:] == -1).all()
    assert s.expand_shared(torch.ones(9)).tolist() == [1.0] * 9 + [0.0] * 8
    assert s.keep_local(torch.zeros(17), x).tolist() == [0.0] * 9 + list(range(9, 17))
    s2 = Sharing.from_patterns(layout_of(net), ["0.bias", "2.bias"])  # local tensors need not be contiguous
    assert s2.local_index.tolist() == [6, 7, 8, 15, 16] and s2.shared_sizes == [6, 6]


@pytest.mark.parametrize("patterns, match", [
    (["head.*"], "pattern 'head.\\*' matches no trainable parameter"),
    (["*"], "match every parameter"),
    (["0.*", "2.*"], "match every parameter"),
    ([], "at least one"),
])
def test_bad_sharing_patterns_are_refused_naming_the_argument(patterns, match):
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
    with pytest.raises(ValueError, match=f"local: .*{match}"):
        Sharing.from_patterns(layout_of(net), patterns)


def test_a_bad_pattern_stops_the_run_before_round_0():
    m = toy_module(FedPer(local=["classifier.*"]), "vmap", bias=True)
    with pytest.raises(ValueError, match="local: pattern 'classifier.\\*' matches no trainable parameter.*weight, bias"):
        run_rounds(m, toy_data(), rounds=1)
    assert m.rounds_done == 0
    with pytest.raises(ValueError, match="local: .*match every parameter"):
        run_rounds(toy_module(FedPer(local=["weight", "bias"]), "vmap", bias=True), toy_data(), rounds=1)


def test_default_local_part_is_the_last_layer_and_norm_names():
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    m = FedPer()
    assert m.make_sharing(net, layout_of(net)).local_names == ("2.weight", "2.bias")
    assert norm_parameter_names(net) == ["1.weight", "1.bias"]
    with pytest.raises(ValueError, match="local: give parameter-name patterns"):
        FedPer(local=[""])


# ----------------------------------------------------------------------------- FedPer and FedRep by hand
def local_part_by_hand(rec, rounds, local, lr=0.1, steps=2):
    """Partial sharing on t = (w1, w2, b) by hand: the ``local`` positions stay each client's (from the
    initial model's), the others are averaged with size weights. FedPer: the bias local; LG-FedAvg (Liang
    et al. 2020, Algorithm 1): the weight (the representation) local, the head shared."""
    shared = [i for i in range(3) if i not in local]
    t0 = torch.cat([W_INIT, torch.zeros(1, dtype=torch.float64)])
    g, own = t0.clone(), [t0.clone() for _ in range(3)]
    for r in range(rounds):
        S = rec.rounds[r]["clients"]
        deltas = []
        for k in S:
            t = g.clone()
            t[local] = own[k][local]
            for _ in range(steps):
                t = t - lr * theta_grad(t, k)
            own[k] = t
            deltas.append(t[shared] - g[shared])
        g[shared] = g[shared] + sum(a * d for a, d in zip(size_weights(S), deltas))
    return g, own


def fedper_by_hand(rec, rounds, lr=0.1, steps=2):
    g, own = local_part_by_hand(rec, rounds, [2], lr, steps)
    return g[:2], [t[2] for t in own]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fedper_two_rounds_by_hand(backend):
    """Base (the weight) aggregated, head (the bias) local: each client trains both from [w, b_k]."""
    m = toy_module(FedPer(local="bias"), backend, bias=True, fraction=2 / 3)
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=2, callbacks=[rec])
    w, b = fedper_by_hand(rec, 2)
    assert set(rec.rounds[0]["clients"]) != set(rec.rounds[1]["clients"])
    torch.testing.assert_close(flat_weights(m), torch.cat([w, torch.zeros(1, dtype=torch.float64)]), **TOL)  # bias: initial
    seen = sorted(set(rec.rounds[0]["clients"]) | set(rec.rounds[1]["clients"]))
    rows = m.objective.rows("local", torch.arange(3), first=torch.full((1,), 9.0, dtype=torch.float64))
    for k in range(3):
        torch.testing.assert_close(rows[k, 0], b[k] if k in seen else torch.tensor(9.0, dtype=torch.float64), **TOL)
    # personalized models: [w, b_k] (the initial head for a client that never trained)
    personal = m.objective.personal_rows(torch.arange(3), flat_weights(m), None)
    for k in range(3):
        torch.testing.assert_close(personal[k], torch.cat([w, b[k].reshape(1)]), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lg_fedavg_is_fedper_with_the_lower_layers_local_two_rounds_by_hand(backend):
    """LG-FedAvg falls out of partial sharing: FedPer whose local part is the representation (the weight)."""
    m = toy_module(FedPer(local="weight"), backend, bias=True, fraction=2 / 3)
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=2, callbacks=[rec])
    g, own = local_part_by_hand(rec, 2, [0, 1])
    torch.testing.assert_close(flat_weights(m)[:2], W_INIT, **TOL)  # the global weight: the initial one
    torch.testing.assert_close(flat_weights(m), g, **TOL)
    assert not torch.equal(g[2], torch.zeros((), dtype=torch.float64))  # the shared head moved
    personal = m.objective.personal_rows(torch.arange(3), flat_weights(m), None)
    for k in range(3):
        torch.testing.assert_close(personal[k], torch.cat([own[k][:2], g[2:]]), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fedrep_two_rounds_by_hand(backend):
    """Head first with the body frozen (the round's 2 steps), then the body with the new head frozen (1 epoch =
    1 full-batch step); the server aggregates the body."""
    lr = 0.1
    m = toy_module(FedRep(local=["bias"], body_epochs=1), backend, bias=True, fraction=2 / 3)
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=2, callbacks=[rec])
    head, body = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    w, b = W_INIT.clone(), [torch.zeros((), dtype=torch.float64) for _ in range(3)]
    for r in range(2):
        S = rec.rounds[r]["clients"]
        deltas = []
        for k in S:
            t = torch.cat([w, b[k].reshape(1)])
            for _ in range(2):
                t = t - lr * head * theta_grad(t, k)
            t = t - lr * body * theta_grad(t, k)
            b[k] = t[2]
            deltas.append(t[:2] - w)
        w = w + sum(a * d for a, d in zip(size_weights(S), deltas))
    torch.testing.assert_close(flat_weights(m), torch.cat([w, torch.zeros(1, dtype=torch.float64)]), **TOL)
    for k in set(rec.rounds[0]["clients"]) | set(rec.rounds[1]["clients"]):
        torch.testing.assert_close(m.objective.rows("local", torch.tensor([k]), first=torch.zeros(1))[0, 0], b[k], **TOL)


def test_fedrep_body_steps_and_bad_settings():
    assert FedRep().body_epochs == 1 and FedRep(body_steps=3).body_epochs is None
    with pytest.raises(ValueError, match="body_epochs/body_steps"):
        FedRep(body_epochs=1, body_steps=2)
    with pytest.raises(ValueError, match="body_steps"):
        FedRep(body_epochs=None, body_steps=0)


# ----------------------------------------------------------------------------- what travels
class Spy(Dense):
    """A dense channel that records what it is given."""

    def __init__(self):
        super().__init__()
        self.sent, self.sizes = [], []

    def upstream(self, updates, cohort, sizes):
        self.sent.append(updates.clone())
        self.sizes.append(list(sizes))
        return super().upstream(updates, cohort, sizes)


def test_the_local_part_is_not_uploaded_nor_counted_in_bits():
    spy = Spy()
    m = toy_module(FedPer(local="bias"), "vmap", bias=True, channel=spy)
    rec = Recorder(m)
    run_rounds(m, toy_data(), rounds=1, callbacks=[rec])
    w, b = fedper_by_hand(rec, 1)
    [sent] = spy.sent
    assert sent.shape == (3, 2) and spy.sizes == [[2]]  # the weight's update only: no bias column
    expected = []
    for k in rec.rounds[0]["clients"]:
        t = torch.cat([W_INIT, torch.zeros(1, dtype=torch.float64)])
        for _ in range(2):
            t = t - 0.1 * theta_grad(t, k)
        expected.append(t[:2] - W_INIT)
    torch.testing.assert_close(sent, torch.stack(expected), **TOL)
    rec_round = m.last_round
    assert rec_round.bits_up == 3 * Dense().bits([2]) and rec_round.bits_down == 3 * Dense().bits([2])
    plain = toy_module(None, "vmap", bias=True)
    run_rounds(plain, toy_data(), rounds=1)
    assert plain.last_round.bits_up == 3 * Dense().bits([2, 1]) > rec_round.bits_up


@pytest.mark.parametrize("placement", ["device", "host", "disk"])
def test_compression_and_server_optimizer_see_the_shared_part_only(placement, tmp_path):
    """Ternary compression keeps its residuals of the shared part ([N, P_s]); a server optimizer with momentum and
    weight decay never moves the local coordinates of the global model; in every client-state placement."""
    opt = lambda params: torch.optim.SGD(params, lr=1.0, momentum=0.9, weight_decay=0.5)  # noqa: E731
    extra = {"client_state_dir": str(tmp_path / "state")} if placement == "disk" else {}
    m = toy_module(FedPer(local="bias"), "vmap", bias=True, channel=0.5, server_optimizer=opt,
                   engine=dict(client_state=placement, **extra))
    with torch.no_grad():
        m.net.bias.fill_(0.25)
    run_rounds(m, toy_data(), rounds=3)
    assert float(m.net.bias) == 0.25  # the global model's local part: the initial one, exactly
    shapes = m.store.describe()
    assert shapes["objective.local"] == [3, 1]
    assert all(shape[-1] == 2 for key, shape in shapes.items() if key.startswith("channel."))


# ----------------------------------------------------------------------------- resume in every placement
N = 10


def resume_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N * 6, 4, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    from lfed.lightning.datamodule import FederatedDataModule

    return FederatedDataModule.from_tensors(x, y, x[:20], y[:20], num_clients=N, partition="iid",
                                            holdout_fraction=0.2, num_classes=3, seed=1)


def resume_module(objective, placement, tmp_path, backend="vmap"):
    from lfed.lightning.module import FederatedModule
    from lfed.personal.fedbn import FedBN

    torch.manual_seed(0)
    if isinstance(objective, FedBN):  # normalization layers with running statistics: the loop backend
        net = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3)).double()
        backend = "loop"
    else:
        net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    engine = dict(backend=backend, client_state=placement)
    if placement == "disk":
        engine["client_state_dir"] = str(tmp_path / f"state-{placement}")
    kwargs = dict(objective=objective, fraction=0.3, stragglers=dict(p_incomplete=0.5),
                  training=dict(client_lr=0.1, batch_size=3, local_epochs=1), engine=engine, seed=2)
    return FederatedModule(net, **kwargs)


def trainer(root, rounds):
    return Trainer(max_steps=rounds, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                   precision="64-true", check_val_every_n_epoch=None, val_check_interval=rounds,
                   limit_val_batches=0, default_root_dir=root)


def objectives():
    from lfed.personal.apfl import APFL
    from lfed.personal.ditto import Ditto
    from lfed.personal.fedbn import FedBN
    from lfed.personal.fedrod import FedRoD

    return {"ditto": lambda: Ditto(lam=0.3), "fedper": lambda: FedPer(), "fedrep": lambda: FedRep(body_steps=2),
            "apfl": lambda: APFL(alpha=0.3, alpha_lr=0.2), "fedbn": lambda: FedBN(), "fedrod": lambda: FedRoD()}


@pytest.mark.parametrize("first,then", [("device", "host"), ("host", "disk"), ("disk", "device")])
@pytest.mark.parametrize("method", ["ditto", "fedper", "fedrep", "apfl", "fedbn", "fedrod"])
def test_resume_with_personal_state_is_bit_identical(method, first, then, tmp_path):
    make = objectives()[method]
    straight = resume_module(make(), "device", tmp_path)
    run_rounds(straight, resume_data(), rounds=4, default_root_dir=tmp_path)
    a = resume_module(make(), first, tmp_path)
    t = trainer(tmp_path, 2)
    t.fit(a, datamodule=resume_data())
    t.save_checkpoint(tmp_path / "r2.ckpt")
    b = resume_module(make(), then, tmp_path)
    trainer(tmp_path, 4).fit(b, datamodule=resume_data(), ckpt_path=tmp_path / "r2.ckpt")
    assert torch.equal(flat_weights(b), flat_weights(straight))
    sa, sb = straight.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    rows = [k for k in sa if k.endswith(".rows")]
    assert rows and all(sa[k].numel() > 0 for k in rows)
    for key in sa:
        assert torch.equal(sa[key].cpu(), sb[key].cpu()), key
    clients = torch.arange(N)
    w = flat_weights(b)
    mine, theirs = straight.objective.personal_rows(clients, w, None), b.objective.personal_rows(clients, w, None)
    if isinstance(mine, tuple):  # FedBN: (rows, per-client statistics)
        assert all(torch.equal(mine[1][k], theirs[1][k]) for k in mine[1])
        mine, theirs = mine[0], theirs[0]
    assert torch.equal(mine, theirs)
