"""FederatedModule with lfed's server pieces, checked by hand through real Lightning rounds.

SPEC §3 (aggregation weights: DWFed, skipped rounds), §4 (IGFL-S attention), §4.1 (server
optimizers on the pseudo-gradient) and §7 (ternary compression with residuals, bits). Every
expected value is computed here from scratch: client updates by autograd on a copy of the
linear model (one full-batch step, ``Δ_k = -η ∇ mean-CE_k(w)``), then the server rule written
out line by line.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import REPO, flat_weights, run_rounds
from lightning.pytorch import Callback
from torch import nn

from lfed.core import registry as algorithms
from lfed.data.partition import label_counts, pack_indices
from lfed.lightning.cli import run_cli
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.participation.stragglers import Stragglers
from lfed.server import attention as attention_mod
from lfed.server.combination import IGFLAttention
from lfed.server.optimizers import FedAdagrad, FedAdam, FedYogi

F64 = torch.float64
D, C = 4, 3  # features, classes: nn.Linear(4, 3) has tensors of 12 and 3 entries
SIZES = [D * C, C]
BACKENDS = ["vmap", "loop"]


# ---------------------------------------------------------------------- helpers
def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(D, C).double()


def _vec(net: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in net.parameters()])


def _data(n: int, seed: int = 0, scale: float = 1.0, labels=None):
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(n, D, generator=g, dtype=F64)
    y = torch.tensor(labels) if labels is not None else torch.randint(0, C, (n,), generator=g)
    return x, y


def _datamodule(x, y, groups) -> FederatedDataModule:
    """Clients hold exactly the example positions in ``groups`` (positions may repeat across clients)."""
    dm = FederatedDataModule.from_tensors(x, y, x, y, num_clients=len(groups), partition="iid",
                                          holdout_fraction=0.0, num_classes=C)
    d = dm.build()
    parts = [torch.tensor(g) for g in groups]
    d.client_index, d.client_sizes = pack_indices(parts)
    d.label_counts = label_counts(y, parts, C)
    return dm


def _module(*, training: dict | None = None, **kwargs) -> FederatedModule:
    """All clients every round, one full-batch local step: Δ_k is one gradient step (``training`` is merged over that)."""
    kwargs.setdefault("fraction", 1.0)
    kwargs["training"] = {"batch_size": None, "local_steps": 1, "client_lr": 1.0, **(training or {})}
    return FederatedModule(kwargs.pop("net", None) or _net(), **kwargs)


def _updates(w, x, y, groups, lr):
    """Δ_k = -lr ∇_w mean_i CE(W x_i + b, y_i) over client k's examples, by autograd, ``[K, P]``."""
    out = []
    for g in groups:
        W = w[: D * C].view(C, D).clone().requires_grad_(True)
        b = w[D * C:].clone().requires_grad_(True)
        loss = nn.functional.cross_entropy(x[g] @ W.T + b, y[g])
        gw, gb = torch.autograd.grad(loss, (W, b))
        out.append(-lr * torch.cat([gw.flatten(), gb]))
    return torch.stack(out)


def _size_weights(groups):
    n = torch.tensor([len(g) for g in groups], dtype=F64)
    return n / n.sum()


def _st(x: torch.Tensor, q: float) -> torch.Tensor:
    """SPEC §7 ST written out: per tensor keep the k = max(floor(n q), 1) largest |x|, set them to ±mean."""
    out = []
    for seg in torch.split(x, SIZES):
        n = seg.numel()
        k = max(math.floor(round(n * q, 9)), 1)
        order = torch.sort(seg.abs(), descending=True).indices[:k]
        mu = seg.abs()[order].mean()
        piece = torch.zeros_like(seg)
        piece[order] = mu * torch.sign(seg[order])
        out.append(piece)
    return torch.cat(out)


def _ternary_bits(q: float) -> int:
    """SPEC §7: 32 + k (1 + ceil(log2 n)) per tensor."""
    return sum(32 + max(math.floor(round(n * q, 9)), 1) * (1 + math.ceil(math.log2(n))) for n in SIZES)


class Record:
    """Wrap a bound method of a module, recording its arguments and result each call."""

    def __init__(self, module, name):
        self.calls = []
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            out = original(*args, **kwargs)
            self.calls.append((tuple(a.clone() if torch.is_tensor(a) else a for a in args),
                               out.clone() if torch.is_tensor(out) else out))
            return out

        setattr(module, name, wrapper)


# ---------------------------------------------------------------------- IGFL-S attention (SPEC §4)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("query", ["self", "global", "time"])
def test_attention_of_identical_client_updates_is_the_plain_mean(backend, query):
    """Three clients on the same examples send the same Δ: any softmax weights of it give Δ itself."""
    groups = [[0, 1, 2, 3, 4, 5]] * 3
    x, y = _data(6)
    modules = {}
    for aggregation in ("mean", query):
        m = _module(combination=aggregation, engine=dict(backend=backend))
        run_rounds(m, _datamodule(x, y, groups), rounds=3)
        modules[aggregation] = m
    w = _vec(_net())
    for _ in range(3):  # hand: w ← w + Δ(w)
        w = w + _updates(w, x, y, groups[:1], 1.0)[0]
    assert torch.allclose(flat_weights(modules["mean"]), w, atol=1e-13, rtol=0)
    assert torch.allclose(flat_weights(modules[query]), w, atol=1e-13, rtol=0)
    att = modules[query].last_round.attention
    assert torch.allclose(att.weights, torch.full((3,), 1 / 3, dtype=F64), atol=1e-15, rtol=0)
    assert att.query == query and float(att.entropy) == pytest.approx(math.log(3), abs=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_attention_first_round_is_the_plain_mean_exactly(backend):
    """Round 0: every previous update is 0, so ψ = 0, α_j = 1/|S| and Δ = uniform mean, bit for bit."""
    groups = [[0, 1, 2], [3, 4, 5, 6], [7, 8]]
    x, y = _data(9, scale=2.0)
    mean = _module(weighting="uniform", engine=dict(backend=backend))
    time = _module(combination="time", engine=dict(backend=backend))
    run_rounds(mean, _datamodule(x, y, groups), rounds=1)
    run_rounds(time, _datamodule(x, y, groups), rounds=1)
    assert torch.equal(flat_weights(time), flat_weights(mean))
    w0 = _vec(_net())
    expected = w0 + _updates(w0, x, y, groups, 1.0).mean(0)
    assert torch.allclose(flat_weights(time), expected, atol=1e-14, rtol=0)
    assert time.last_round.attention.weights.tolist() == [1 / 3] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_attention_softmax_two_rounds_by_hand(backend):
    """SPEC §4 default (time_weights=softmax): round 1 weighs α_j = exp<Δ_j^0, Δ_j^1> / Σ_τ exp<Δ_τ^0, Δ_τ^1>."""
    groups = [[0, 1, 2], [3, 4, 5, 6], [7, 8]]
    x, y = _data(9, seed=3, scale=2.0)
    lr = 2.0
    m = _module(combination="time", training=dict(client_lr=lr), engine=dict(backend=backend))
    run_rounds(m, _datamodule(x, y, groups), rounds=2)

    w0 = _vec(_net())
    d0 = _updates(w0, x, y, groups, lr)
    w1 = w0 + d0.mean(0)  # round 0: zero queries, α_j = 1/3
    d1 = _updates(w1, x, y, groups, lr)
    own = torch.stack([d0[j] @ d1[j] for j in range(3)])
    alpha = torch.exp(own) / torch.exp(own).sum()
    w2 = w1 + (alpha[:, None] * d1).sum(0)

    assert torch.allclose(flat_weights(m), w2, atol=1e-12, rtol=0)
    order = m.last_round.cohort.clients.tolist()
    assert torch.allclose(m.last_round.attention.weights, alpha[order], atol=1e-12, rtol=0)
    assert abs(float(m.last_round.attention.weights.sum()) - 1) < 1e-14  # sums to 1 (SPEC §4)
    assert (alpha - 1 / 3).abs().max() > 0.05  # not the plain mean, so the test can tell them apart
    spread = (own.max() - own.min()).item()
    assert float(m.last_round.attention.logit_spread) == pytest.approx(spread, abs=1e-12)
    assert float(m.last_round.attention.mean_sq_norm) == pytest.approx(float((d1 * d1).sum(1).mean()), abs=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_attention_two_rounds_by_hand(backend):
    """time_weights=diagonal: round 1 uses each client's round-0 update as its query: α_j = exp<Δ_j^0, Δ_j^1> / Σ_τ exp<Δ_j^0, Δ_τ^1>."""
    groups = [[0, 1, 2], [3, 4, 5, 6], [7, 8]]
    x, y = _data(9, seed=3, scale=2.0)
    lr = 2.0
    m = _module(combination=IGFLAttention("time", time_weights="diagonal"), training=dict(client_lr=lr), engine=dict(backend=backend))
    run_rounds(m, _datamodule(x, y, groups), rounds=2)

    w0 = _vec(_net())
    d0 = _updates(w0, x, y, groups, lr)
    w1 = w0 + d0.mean(0)  # round 0: zero queries, α_j = 1/3
    d1 = _updates(w1, x, y, groups, lr)
    alpha = torch.empty(3, dtype=F64)
    for j in range(3):
        scores = torch.stack([d0[j] @ d1[t] for t in range(3)])
        alpha[j] = torch.exp(scores[j]) / torch.exp(scores).sum()
    w2 = w1 + (alpha[:, None] * d1).sum(0)  # not renormalised (SPEC §4)

    assert torch.allclose(flat_weights(m), w2, atol=1e-12, rtol=0)
    order = m.last_round.cohort.clients.tolist()
    assert torch.allclose(m.last_round.attention.weights, alpha[order], atol=1e-12, rtol=0)
    # the hand weights really are not the plain mean, so this test can tell the two apart
    assert (alpha - 1 / 3).abs().max() > 0.05 and abs(float(alpha.sum()) - 1) > 1e-3
    assert (flat_weights(m) - (w1 + d1.mean(0))).abs().max() > 1e-3
    assert torch.allclose(m.history.previous_update, d1, atol=1e-13, rtol=0)  # Δw_k ← this round's update


def test_time_attention_queries_are_each_clients_update_from_its_last_round(monkeypatch):
    """With sampling, client j's query is its update from the last round it was sampled (0 before)."""
    calls = []
    original = attention_mod.attention_combine

    def spy(updates, query="self", previous_updates=None, **kwargs):
        calls.append((updates.clone(), previous_updates.clone()))
        return original(updates, query, previous_updates, **kwargs)

    monkeypatch.setattr(attention_mod, "attention_combine", spy)
    groups = [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    x, y = _data(10, seed=1)
    m = _module(combination="time", fraction=0.5, training=dict(client_lr=0.5))
    cohorts = Record(m.combination, "combine")
    run_rounds(m, _datamodule(x, y, groups), rounds=8)
    last: dict[int, torch.Tensor] = {}
    gaps = 0
    seen_round: dict[int, int] = {}
    for r, ((args, _), (updates, previous)) in enumerate(zip(cohorts.calls, calls)):
        clients = args[2].clients.tolist()
        for i, c in enumerate(clients):
            expected = last.get(c, torch.zeros_like(updates[i]))
            assert torch.equal(previous[i], expected), (r, c)
            gaps += c in seen_round and seen_round[c] < r - 1
        for i, c in enumerate(clients):
            last[c], seen_round[c] = updates[i], r
    assert gaps > 0  # some client came back after sitting out a round: its query is older than r - 1


# ---------------------------------------------------------------------- DWFed (SPEC §3)
@pytest.mark.parametrize("backend", BACKENDS)
def test_dwfed_with_identical_label_distributions_is_uniform(backend):
    """Same label shares, different sizes: every D_k = 0, every ISH_k = 1, so a_k = 1/K (not n_k/n)."""
    labels = [0, 1, 2] + [0, 0, 1, 1, 2, 2] + [0, 1, 2] * 3
    groups = [[0, 1, 2], list(range(3, 9)), list(range(9, 18))]
    x, y = _data(18, seed=2, labels=labels)
    runs = {}
    for weighting in ("dwfed", "uniform", "size"):
        m = _module(weighting=weighting, engine=dict(backend=backend))
        run_rounds(m, _datamodule(x, y, groups), rounds=2)
        runs[weighting] = flat_weights(m)
    assert torch.allclose(runs["dwfed"], runs["uniform"], atol=1e-14, rtol=0)
    assert (runs["dwfed"] - runs["size"]).abs().max() > 1e-4


def test_dwfed_weights_from_label_counts_by_hand():
    """Counts [2,0,0], [1,1,0], [1,1,2]: P = (4,2,2)/8; D = (1, 0.5, 0.5); ISH = (1 - D/3)/(1 + D)."""
    labels = [0, 0] + [0, 1] + [0, 1, 2, 2]
    groups = [[0, 1], [2, 3], [4, 5, 6, 7]]
    x, y = _data(8, seed=4, labels=labels)
    m = _module(weighting="dwfed")
    run_rounds(m, _datamodule(x, y, groups), rounds=1)
    # D_1 = |1 - .5| + |0 - .25| + |0 - .25| = 1; D_2 = 0 + .25 + .25 = .5; D_3 = |.25-.5| + 0 + |.5-.25| = .5
    ish = torch.tensor([(1 - 1 / 3) / 2, (1 - 0.5 / 3) / 1.5, (1 - 0.5 / 3) / 1.5], dtype=F64)
    a = ish / ish.sum()  # (1/3, 5/9, 5/9) / (13/9) = (3, 5, 5) / 13
    assert torch.allclose(a, torch.tensor([3, 5, 5], dtype=F64) / 13, atol=1e-15)
    w0 = _vec(_net())
    expected = w0 + a @ _updates(w0, x, y, groups, 1.0)
    assert torch.allclose(flat_weights(m), expected, atol=1e-14, rtol=0)


# ---------------------------------------------------------------------- server optimizers (SPEC §4.1)
def _hand_server(kind: str, hp: dict, rounds: int, x, y, groups, lr_client: float):
    """The server rules of SPEC §4.1 on the size-weighted mean Δ, written out."""
    w = _vec(_net())
    a = _size_weights(groups)
    m = torch.zeros_like(w)
    v = torch.full_like(w, hp.get("tau", 0.0) ** 2)
    for _ in range(rounds):
        delta = a @ _updates(w, x, y, groups, lr_client)
        if kind == "fedavgm":  # v ← βv + Δ; w ← w + η v
            m = hp["momentum"] * m + delta
            w = w + hp["lr"] * m
            continue
        b1 = hp.get("beta1", 0.9)
        b2 = hp.get("beta2", 0.99)
        m = b1 * m + (1 - b1) * delta
        if kind == "fedadam":
            v = b2 * v + (1 - b2) * delta**2
        elif kind == "fedyogi":
            v = v - (1 - b2) * delta**2 * torch.sign(v - delta**2)
        else:  # fedadagrad
            v = v + delta**2
        w = w + hp["lr"] * m / (torch.sqrt(v) + hp["tau"])
    return w


SERVERS = [
    ("fedavgm", {"lr": 0.5, "momentum": 0.9}, functools.partial(torch.optim.SGD, lr=0.5, momentum=0.9)),
    ("fedadam", {"lr": 0.1, "tau": 0.01}, functools.partial(FedAdam, lr=0.1, betas=(0.9, 0.99), tau=0.01)),
    ("fedyogi", {"lr": 0.1, "tau": 0.01}, functools.partial(FedYogi, lr=0.1, betas=(0.9, 0.99), tau=0.01)),
    ("fedadagrad", {"lr": 0.1, "tau": 0.1, "beta1": 0.5},
     functools.partial(FedAdagrad, lr=0.1, beta1=0.5, tau=0.1)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind,hp,factory", SERVERS, ids=[s[0] for s in SERVERS])
def test_server_optimizer_two_rounds_by_hand(kind, hp, factory, backend):
    groups = [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9]]
    x, y = _data(10, seed=5)
    m = _module(server_optimizer=factory, training=dict(client_lr=0.5), engine=dict(backend=backend))
    run_rounds(m, _datamodule(x, y, groups), rounds=2)
    expected = _hand_server(kind, hp, 2, x, y, groups, 0.5)
    assert torch.allclose(flat_weights(m), expected, atol=1e-13, rtol=0)
    plain = _hand_server("fedavgm", {"lr": 1.0, "momentum": 0.0}, 2, x, y, groups, 0.5)
    assert (expected - plain).abs().max() > 1e-3  # the server rule matters


@pytest.mark.parametrize(
    "algorithm,kind,hp",
    [
        ("fedavgm", "fedavgm", {"lr": 1.0, "momentum": 0.9}),  # 000 §5.1: β = 0.9, server lr 1
        ("fedadam", "fedadam", {"lr": 0.01, "tau": 0.01}),  # 000: τ ∈ {0.1, 0.01}; Reddi β = (0.9, 0.99)
    ],
)
def test_server_presets_match_the_papers(algorithm, kind, hp):
    groups = [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9]]
    x, y = _data(10, seed=6)
    m = _module(algorithm=algorithm, training=dict(client_lr=0.5))
    run_rounds(m, _datamodule(x, y, groups), rounds=2)
    assert torch.allclose(flat_weights(m), _hand_server(kind, hp, 2, x, y, groups, 0.5), atol=1e-13, rtol=0)


@pytest.mark.parametrize(
    "server,cls,check",
    [
        ("{class_path: lfed.server.optimizers.FedAdam, init_args: {lr: 0.02, tau: 0.1, betas: [0.8, 0.95]}}",
         FedAdam, {"lr": 0.02, "tau": 0.1, "betas": (0.8, 0.95)}),
        ("{class_path: torch.optim.SGD, init_args: {lr: 1.0, momentum: 0.9}}",
         torch.optim.SGD, {"lr": 1.0, "momentum": 0.9}),
    ],
)
def test_server_optimizer_from_a_config_through_the_cli(tmp_path, server, cls, check):
    config = tmp_path / "server.yaml"
    config.write_text(f"model:\n  server_optimizer: {server}\n")
    cli = run_cli([
        "fit", "--config", str(REPO / "configs/quickstart.yaml"), "--config", str(config),
        "--trainer.max_steps", "2", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false",
        "--trainer.limit_val_batches", "0",
    ])
    optimizer = cli.model.server_optimizers[0]
    assert type(optimizer) is cls
    for key, value in check.items():
        got = optimizer.param_groups[0][key]
        assert (tuple(got) if isinstance(value, tuple) else got) == value
    assert cli.trainer.global_step == 2
    state = optimizer.state[next(iter(cli.model.net.parameters()))]
    assert (state["step"] == 2) if cls is not torch.optim.SGD else ("momentum_buffer" in state)


# ---------------------------------------------------------------------- compression (SPEC §7)
@pytest.mark.parametrize("backend", BACKENDS)
def test_compression_switched_off_is_the_plain_run_bit_for_bit(backend):
    """``channel: false`` turns off the efl preset's ST: the same run as the uncompressed composition."""
    groups = [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11, 12]]
    x, y = _data(13, seed=7)
    common = dict(training=dict(client_lr=0.3, local_steps=3), stragglers=dict(p_incomplete=0.5), engine=dict(backend=backend), seed=1)
    off = _module(algorithm="efl", channel=False, **common)
    plain = _module(objective="efl", partial_work="scale", **common)
    on = _module(algorithm="efl", **common)
    for m in (off, plain, on):
        run_rounds(m, _datamodule(x, y, groups), rounds=2)
    assert off.composition["channel"] is None and not hasattr(off.channel, "client_residual")
    assert torch.equal(flat_weights(off), flat_weights(plain))
    assert on.composition["channel"] == 0.1 and (flat_weights(on) - flat_weights(plain)).abs().max() > 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_compression_q_one_quantises_every_entry_to_plus_minus_mu(backend):
    """q = 1 keeps all entries but sends ±mean|x| per tensor, up and down: not the identity."""
    groups = [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9]]
    x, y = _data(10, seed=8)
    m = _module(channel=1.0, engine=dict(backend=backend))
    run_rounds(m, _datamodule(x, y, groups), rounds=1)
    w0 = _vec(_net())
    deltas = _updates(w0, x, y, groups, 1.0)
    sent = torch.stack([_st(d, 1.0) for d in deltas])
    for s, d in zip(sent, deltas):  # every entry kept, each ±μ of its tensor
        for seg_s, seg_d in zip(torch.split(s, SIZES), torch.split(d, SIZES)):
            assert torch.allclose(seg_s.abs(), seg_d.abs().mean().expand_as(seg_s), atol=0, rtol=1e-15)
            assert torch.equal(torch.sign(seg_s), torch.sign(seg_d))
    combined = _size_weights(groups) @ sent
    broadcast = _st(combined, 1.0)
    assert torch.allclose(flat_weights(m), w0 + broadcast, atol=1e-14, rtol=0)
    assert (flat_weights(m) - (w0 + _size_weights(groups) @ deltas)).abs().max() > 1e-4  # not the identity
    order = torch.tensor([0, 1, 2])
    assert torch.allclose(m.channel.client_residual[order], deltas - sent, atol=1e-14, rtol=0)
    assert torch.allclose(m.channel.server_residual, combined - broadcast, atol=1e-14, rtol=0)


def _run_compressed(backend, rounds=3, q=0.4, seed=11, p_inactive=0.3):
    groups = [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13]]
    x, y = _data(14, seed=9, scale=1.5)
    m = _module(channel=q, fraction=0.75, stragglers=dict(p_inactive=p_inactive), engine=dict(backend=backend), seed=seed)
    up = Record(m.channel, "upstream")
    trainer = run_rounds(m, _datamodule(x, y, groups), rounds=rounds)
    return m, trainer, up, x, y, groups


@pytest.mark.parametrize("backend", BACKENDS)
def test_residuals_carry_exactly_what_compression_dropped(backend):
    """Client and server residuals after three rounds with inactive clients vs the SPEC §7 recursion."""
    q = 0.4
    m, trainer, up, x, y, groups = _run_compressed(backend, q=q)
    N, P = len(groups), sum(SIZES)
    w = _vec(_net())
    R = torch.zeros(N, P, dtype=F64)
    RG = torch.zeros(P, dtype=F64)
    n = torch.tensor([len(g) for g in groups], dtype=F64)
    inactive_seen = 0
    for (_updates_arg, cohort, _sizes), _ in up.calls:
        clients, counting = cohort.clients, cohort.counting
        ids = clients[counting].tolist()
        inactive_seen += int((~counting).sum())
        deltas = _updates(w, x, y, [groups[i] for i in ids], 1.0)
        a = n[ids] / n[ids].sum()
        combined = torch.zeros(P, dtype=F64)
        for k, i in enumerate(ids):
            total = R[i] + deltas[k]  # Δ_k' = R_k + Δ_k
            sent = _st(total, q)
            R[i] = total - sent  # R_k ← Δ_k' - ST(Δ_k')
            combined += a[k] * sent
        total = RG + combined  # Δ_G = R_G + Σ a_k ST(Δ_k')
        broadcast = _st(total, q)
        RG = total - broadcast
        w = w + broadcast  # the model moves by the broadcast update
    assert len(up.calls) == 3 and inactive_seen > 0  # the seed gives inactive clients, who keep R_k
    assert torch.allclose(m.channel.client_residual, R, atol=1e-14, rtol=0)
    assert torch.allclose(m.channel.server_residual, RG, atol=1e-14, rtol=0)
    assert torch.allclose(flat_weights(m), w, atol=1e-14, rtol=0)
    assert R.abs().sum() > 0 and RG.abs().sum() > 0


def test_bits_logged_match_the_spec_formula():
    """Per model: 32 + k (1 + ceil(log2 n)) per tensor compressed, 32 n dense (SPEC §7)."""
    q = 0.4
    # by hand: n = 12, k = floor(4.8) = 4 -> 32 + 4 (1 + 4) = 52; n = 3, k = 1 -> 32 + 1 (1 + 2) = 35
    assert _ternary_bits(q) == 87
    m, trainer, up, *_ = _run_compressed("vmap", q=q)
    uploads = [int(c.counting.sum()) for (_, c, _), _ in up.calls]
    assert m.comm.bits_up == 87 * sum(uploads) and m.comm.uploads == sum(uploads)
    assert m.comm.bits_down == 87 * 3 * 3  # 3 of 4 clients sampled each round
    metrics = trainer.callback_metrics
    assert float(metrics["comm/bits_up"]) == 87 * uploads[-1]
    assert float(metrics["comm/bits_down"]) == 87 * 3
    dense_m = _module(fraction=0.75, stragglers=dict(p_inactive=0.3), seed=11)
    groups = [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13]]
    x, y = _data(14, seed=9, scale=1.5)
    run_rounds(dense_m, _datamodule(x, y, groups), rounds=3)
    assert dense_m.comm.bits_up == 32 * 15 * dense_m.comm.uploads and dense_m.comm.uploads == sum(uploads)
    assert dense_m.comm.bits_down == 32 * 15 * 9


@pytest.mark.parametrize(
    "kwargs",
    [
        {"algorithm": "fedavg"},
        {"algorithm": "fedprox", "objective": {"class_path": "lfed.client.objectives.Prox", "init_args": {"mu": 0.1}}},
        {"algorithm": "scaffold"},
        {"algorithm": "igfl"},
        {"algorithm": "igfl_s_time"},
        {"algorithm": "efl", "stragglers": {"p_incomplete": 0.3}},
        {"algorithm": "fedadam"},
    ],
    ids=lambda k: k["algorithm"],
)
def test_compression_composes_with_every_objective_and_server(kwargs):
    """Error feedback conserves every update: Σ_r Δ_k = Σ_r sent_k + R_k and Σ_r (Σ a_k sent_k) = Σ_r broadcast + R_G."""
    groups = [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13]]
    x, y = _data(14, seed=10)
    m = _module(channel=0.3, fraction=0.75, training=dict(local_steps=2, client_lr=0.5), **kwargs)
    up, down = Record(m.channel, "upstream"), Record(m.channel, "downstream")
    run_rounds(m, _datamodule(x, y, groups), rounds=3)
    P = sum(SIZES)
    raw, sent = torch.zeros(len(groups), P, dtype=F64), torch.zeros(len(groups), P, dtype=F64)
    for (updates, cohort, _sizes), out in up.calls:
        clients, counting = cohort.clients, cohort.counting
        raw[clients[counting]] += updates[counting]
        sent[clients[counting]] += out[counting]
        for row in out[counting]:  # ternary: per tensor at most k non-zeros, all of one magnitude
            for seg, k in zip(torch.split(row, SIZES), (3, 1)):
                nz = seg[seg != 0].abs()
                assert nz.numel() <= k and torch.allclose(nz, nz[0].expand_as(nz), rtol=1e-15, atol=0)
    assert torch.allclose(raw, sent + m.channel.client_residual, atol=1e-14, rtol=0)
    combined = sum(args[0] for args, _ in down.calls)
    broadcast = sum(out for _, out in down.calls)
    assert torch.allclose(combined, broadcast + m.channel.server_residual, atol=1e-14, rtol=0)
    if kwargs["algorithm"] != "fedadam":  # SGD(lr=1): the model moved by exactly the broadcasts
        assert torch.allclose(flat_weights(m), _vec(_net()) + broadcast, atol=1e-14, rtol=0)


# ---------------------------------------------------------------------- skipped rounds, bad input
class Blackout(Stragglers):
    """Every client inactive in the listed rounds, every client complete otherwise."""

    def __init__(self, rounds):
        super().__init__()
        self.rounds, self.calls = set(rounds), 0

    def draw(self, step_budget, generator):
        r, self.calls = self.calls, self.calls + 1
        return torch.zeros_like(step_budget) if r in self.rounds else step_budget.clone()


class Snapshot(Callback):
    """State of the module and its server optimizer around one round."""

    def __init__(self, round_):
        self.round, self.before, self.after = round_, None, None

    def _state(self, trainer, module):
        opt = module.server_optimizers[0].state_dict()
        return ({k: v.clone() for k, v in module.state_dict().items()},
                {k: {n: (t.clone() if torch.is_tensor(t) else t) for n, t in s.items()} for k, s in opt["state"].items()},
                dict(module.comm.state_dict()), trainer.global_step)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.round:
            self.before = self._state(trainer, module)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.round + 1:
            self.after = self._state(trainer, module)
            self.skipped = float(trainer.callback_metrics.get("round/skipped", 0.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_with_every_client_inactive_changes_nothing_but_the_round(backend):
    """IGFL-C + time attention + ST + FedAdam + AdaFL sampling: round 2 is skipped, all state kept."""
    groups = [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13]]
    x, y = _data(14, seed=12)
    m = _module(objective="igfl", combination="time", channel=0.5, sampler="attention", fraction=0.75,
                server_optimizer=functools.partial(FedAdam, lr=0.05, tau=0.01), training=dict(client_lr=0.5), engine=dict(backend=backend))
    m.participation.stragglers = Blackout({2})
    snap = Snapshot(2)
    trainer = run_rounds(m, _datamodule(x, y, groups), rounds=4, callbacks=[snap])
    (state0, opt0, comm0, step0), (state1, opt1, comm1, step1) = snap.before, snap.after
    assert step1 == step0 + 1 and trainer.global_step == 4 and snap.skipped == 1.0
    assert state0.keys() == state1.keys()
    assert {"history.previous_update.rows", "history.global_change", "channel.client_residual.rows", "channel.server_residual"} <= state0.keys()
    for key in state0:
        assert torch.equal(state0[key], state1[key]), key
    assert opt0.keys() == opt1.keys() and opt0
    for p in opt0:
        for name in opt0[p]:
            same = torch.equal(opt0[p][name], opt1[p][name]) if torch.is_tensor(opt0[p][name]) else opt0[p][name] == opt1[p][name]
            assert same, (p, name)
    # communication: the round is counted, the cohort was sent the model, nobody's upload counts
    assert comm1["rounds"] == comm0["rounds"] + 1 and comm1["uploads"] == comm0["uploads"]
    assert comm1["bits_up"] == comm0["bits_up"] and comm1["bits_down"] > comm0["bits_down"]
    assert m.comm.rounds == 4


ATTENTION = "lfed.server.combination.IGFLAttention"  # the combination as a config gives it: built by FederatedModule


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"channel": 1.5}, r"q \(sparsity\).*1\.5"),
        ({"channel": 0.0}, r"q \(sparsity\).*0\.0"),
        ({"channel": -0.1}, r"q \(sparsity\)"),
        ({"channel": float("nan")}, r"q \(sparsity\)"),
        ({"channel": True}, r"q \(sparsity\).*True"),
        ({"combination": {"class_path": ATTENTION, "init_args": {"temperature": 0.0}}}, "attention_temperature.*> 0"),
        ({"combination": {"class_path": ATTENTION, "init_args": {"temperature": -1.0}}}, "attention_temperature"),
        ({"combination": {"class_path": ATTENTION, "init_args": {"temperature": float("inf")}}}, "attention_temperature"),
        ({"combination": "keys"}, re.escape(f"combination: 'keys' is not one of {algorithms.names('combination')}")),
        ({"weighting": "ish"}, r"weighting: .ish. is not one of \(.size., .uniform., .dwfed.\)"),
        ({"partial_work": "ignore"}, r"partial_work: .ignore. is not one of"),
    ],
)
def test_bad_server_arguments_fail_early_with_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _module(**kwargs)


@pytest.mark.parametrize(
    "algorithm,expected",
    [
        # 000 Table 2 (cross-device, C = 0.1, 10 classes, lfed's default setting): global attention
        ("igfl", {"objective": "igfl", "aggregation": "global", "weighting": "size"}),
        ("igfl_s", {"objective": "plain", "aggregation": "global"}),
        ("igfl_s_self", {"objective": "plain", "aggregation": "self"}),
        ("igfl_s_time", {"objective": "plain", "aggregation": "time"}),
        ("igfl_c", {"objective": "igfl", "aggregation": "mean"}),
        ("dwfed", {"objective": "plain", "weighting": "dwfed", "aggregation": "mean"}),
        ("efl", {"objective": "efl", "partial_work": "scale", "compression": 0.1}),
    ],
)
def test_server_side_presets(algorithm, expected):
    m = FederatedModule(nn.Linear(2, 2), algorithm=algorithm)
    got = {"objective": m.objective.name, "aggregation": m.composition["combination"], "weighting": m.composition["weighting"],
           "partial_work": m.composition["partial_work"], "compression": m.composition["channel"]}
    assert {k: got[k] for k in expected} == expected


# ---------------------------------------------------------------------- configs of the server side
SERVER_CONFIGS = [f"{a}_{d}" for a in ("igfl", "igfl_s", "dwfed", "fedavgm", "fedadam", "efl_compressed")
                  for d in ("digits", "mnist")]
COMPOSITION = {  # objective, weighting, partial_work, aggregation, compression, server optimizer class
    "igfl": ("igfl", "size", "keep", "global", None, torch.optim.SGD),
    "igfl_s": ("plain", "size", "keep", "self", None, torch.optim.SGD),
    "dwfed": ("plain", "dwfed", "keep", "mean", None, torch.optim.SGD),
    "fedavgm": ("plain", "size", "keep", "mean", None, torch.optim.SGD),
    "fedadam": ("plain", "size", "keep", "mean", None, FedAdam),
    "efl_compressed": ("efl", "size", "scale", "mean", 0.1, torch.optim.SGD),
}
QUIET = ["--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false"]


@pytest.mark.parametrize("stem", SERVER_CONFIGS)
def test_server_configs_compose_what_their_names_say_and_run(stem, tmp_path, data_dir):
    """``lfed fit --config configs/<stem>.yaml``: two short rounds (digits) or one (MNIST), to stay fast."""
    mnist = stem.endswith("mnist")
    rounds = 1 if mnist else 2
    extra = [f"--data.data_dir={data_dir}", "--model.training.local_steps=2"] if mnist else ["--model.training.local_steps=3"]
    cli = run_cli(["fit", "--config", str(REPO / "configs" / f"{stem}.yaml"), *QUIET,
                   f"--trainer.default_root_dir={tmp_path}", f"--trainer.max_steps={rounds}",
                   f"--trainer.val_check_interval={rounds}", *extra])
    m, name = cli.model, stem.rsplit("_", 1)[0]
    objective, weighting, partial, aggregation, compression, server = COMPOSITION[name]
    c = m.composition
    assert (m.objective.name, c["weighting"], c["partial_work"], c["combination"], c["channel"]) == (
        objective, weighting, partial, aggregation, compression)
    optimizer = cli.model.server_optimizers[0]
    assert type(optimizer) is server
    group = optimizer.param_groups[0]
    if name == "fedavgm":
        assert (group["lr"], group["momentum"]) == (1.0, 0.9)  # 000 §5.1
    if name == "fedadam":
        assert group["tau"] == 0.01 and tuple(group["betas"]) == (0.9, 0.99)
    assert cli.trainer.global_step == rounds
    assert torch.isfinite(m.layout.module_vector(m.net)).all()
    assert 0.0 <= float(cli.trainer.callback_metrics["test/acc"]) <= 1.0
    run_dir = Path(cli.trainer.default_root_dir)  # the run's own directory, <root>/runs/<name>/version_0
    assert run_dir.parent.parent == tmp_path / "runs"
    if name.startswith("igfl"):  # the config's AttentionHeatmap wrote the last round's heatmap
        assert (run_dir / "attention" / f"attention_last_round{cli.trainer.global_step:05d}.png").exists()
        assert "attention/entropy" in cli.trainer.callback_metrics
    if name == "efl_compressed":
        bits = _ternary_bits_for(m.layout.sizes, 0.1)
        assert m.comm.bits_up == bits * m.comm.uploads
        assert (run_dir / "communication.csv").exists()


def _ternary_bits_for(sizes, q):
    return sum(32 + max(math.floor(round(n * q, 9)), 1) * (1 + math.ceil(math.log2(n))) for n in sizes)


def test_every_client_always_inactive_is_refused_before_the_first_round():
    """p_inactive = 1: no round could ever change the model; a clear error instead of N skipped rounds.
    (A single round in which everyone happens to be inactive is a logged skip: see the Blackout test.)"""
    with pytest.raises(ValueError, match=r"p_inactive: 1\.0 makes every sampled client inactive"):
        _module(stragglers=dict(p_inactive=1.0))  # refused where it is set: the participation component checks itself
