"""Asynchronous FL on a simulated clock (lfed.participation.clock, lfed.core.asynchronous; docs/async.md).

The exactness tests run lfed's FedBuff and FedAsync for 20 server steps through the Trainer and
compare the server model with a hand-written float64 event simulation: a heap over arrival times,
plain torch, no lfed code but the documented seeding of the dispatch draw (:func:`_hand_draw`: from
:func:`lfed.rng.round_generator` ``(seed, step, "sample")``, uniform integers kept at their first appearance, the
clients in flight skipped; ``randperm(N)`` with availability windows or a large share of the population).
Synchronous FedAvg is the special case ``C = M = K`` with equal durations, bit for bit.
"""

from __future__ import annotations

import functools
import heapq
import math

import pytest
import torch
from conftest import flat_weights, run_rounds
from torch import nn
from torch.nn import functional as F

from lfed.base.declaration import Declaration, Supports
from lfed.client.objectives import Prox
from lfed.core.asynchronous import Asynchronous, FedAsync, FedBuff, staleness_weight
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.participation.clock import SimulatedClock
from lfed.rng import round_generator

BACKENDS = ["vmap", "loop"]
N, D, CLASSES = 12, 5, 3


# ----------------------------------------------------------------------------- the clock


def test_constant_durations_are_time_per_step_times_steps():
    clock = SimulatedClock("constant", time_per_step=0.5)
    d = clock.durations(torch.tensor([3, 1]), torch.tensor([4, 6]), step=7, seed=0, num_clients=5)
    assert d.dtype == torch.float64 and d.tolist() == [2.0, 3.0]


def test_lognormal_durations_are_seeded_per_client_speed_times_jitter():
    clock = SimulatedClock("lognormal", time_per_step=2.0, speed_sigma=1.0, jitter_sigma=0.0)
    clients, steps = torch.tensor([0, 4, 9]), torch.tensor([3, 3, 3])
    d0 = clock.durations(clients, steps, step=0, seed=1, num_clients=10)
    d5 = clock.durations(clients, steps, step=5, seed=1, num_clients=10)
    assert torch.equal(d0, d5)  # no jitter: a client's speed is its own, every participation
    z = torch.randn(10, generator=round_generator(1, 0, "clock_speed"), dtype=torch.float64)
    assert torch.equal(d0, 2.0 * 3 * torch.exp(z[clients]))
    other = SimulatedClock("lognormal", speed_sigma=1.0, jitter_sigma=0.0).durations(clients, steps, 0, 2, 10)
    assert not torch.equal(other / 3, d0 / 6)  # another seed, other speeds
    jitter = SimulatedClock("lognormal", time_per_step=2.0, speed_sigma=1.0, jitter_sigma=0.3)
    j0, j1 = (jitter.durations(clients, steps, step=s, seed=1, num_clients=10) for s in (0, 1))
    assert not torch.equal(j0, j1) and torch.equal(j0, jitter.durations(clients, steps, step=0, seed=1, num_clients=10))
    # heavy right tail: the mean of many speeds is well above the median (log-normal, sigma 1: e^0.5 = 1.65)
    m = SimulatedClock("lognormal", speed_sigma=1.0).speeds(0, 20000)
    assert m.mean() / m.median() == pytest.approx(math.exp(0.5), rel=0.05)


def test_durations_from_a_file(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("# seconds\n1.5\n2\n\n0.25\n")
    clock = SimulatedClock("file", durations_file=str(path))
    assert clock.durations(torch.tensor([2, 0]), torch.tensor([9, 9]), 0, 0, 3).tolist() == [0.25, 1.5]
    with pytest.raises(ValueError, match="holds 3 durations, the data has 4 clients"):
        clock.speeds(1, 4)
    path.write_text("1\n-2\n3\n")
    with pytest.raises(ValueError, match="positive and finite"):
        SimulatedClock("file", durations_file=str(path)).speeds(0, 3)
    with pytest.raises(ValueError, match="durations_file"):
        SimulatedClock("lognormal", durations_file=str(path))


def test_availability_windows_are_periodic_seeded_and_give_the_next_opening():
    """Client k is available in [φ_k + n p, φ_k + n p + f p), φ_k = p u_k, u_k ~ U(0, 1) seeded (seed, 0, "clock_window")."""
    clock = SimulatedClock("constant", availability_period=10.0, availability_fraction=0.3)
    u = torch.rand(4, generator=round_generator(7, 0, "clock_window"), dtype=torch.float64)
    assert torch.equal(clock.phases(7, 4), 10.0 * u)
    clock._phases = ((7, 4), torch.tensor([0.0, 2.0, 9.0, 5.5], dtype=torch.float64))  # hand phases
    # at t = 12.5: client 0 opened at 10 (open until 13), client 1 opens at 12 (open until 15),
    # client 2 opened at 9 (closed at 12, next 19), client 3 opened at 5.5 (closed at 8.5, next 15.5)
    got = clock.next_available(torch.tensor([0, 1, 2, 3]), 12.5, seed=7, num_clients=4)
    assert got.tolist() == pytest.approx([12.5, 12.5, 19.0, 15.5], abs=1e-12)
    assert SimulatedClock("constant", availability_period=10.0, availability_fraction=1.0).windows is False
    assert SimulatedClock("constant").next_available(torch.tensor([1, 0]), 3.0, 0, 2).tolist() == [3.0, 3.0]
    with pytest.raises(ValueError, match="availability_fraction"):
        SimulatedClock("constant", availability_period=10.0, availability_fraction=0.0)
    with pytest.raises(ValueError, match="availability_period"):
        SimulatedClock("constant", availability_period=-1.0)


def test_the_clock_and_the_queue_are_in_the_state_dict():
    a = Asynchronous(concurrency=3, buffer=1, clock=SimulatedClock("constant"))
    a.clock.now, a.events, a.seq, a.times = 4.5, [(5.0, 2, 0, 7, 1, 3)], 3, [1.0, 4.5]
    state = a.state_dict()
    b = Asynchronous(concurrency=3, buffer=1, clock=SimulatedClock("constant"))
    b.load_state_dict(state)
    assert (b.clock.now, b.events, b.seq, b.times) == (4.5, [(5.0, 2, 0, 7, 1, 3)], 3, [1.0, 4.5])


def test_staleness_weights():
    assert staleness_weight(5, "constant") == 1.0
    assert staleness_weight(3, "polynomial", 0.5) == 0.5  # FedBuff: 1 / sqrt(1 + τ)
    assert staleness_weight(2, "hinge", 0.5, 2) == 1.0 and staleness_weight(6, "hinge", 0.5, 2) == 1 / 3
    with pytest.raises(ValueError, match="buffer"):
        Asynchronous(concurrency=2, buffer=3)
    with pytest.raises(ValueError, match="mixing"):
        FedAsync(mixing=1.5)
    with pytest.raises(ValueError, match="mixing: FedAsync mixes one arrival per server step .* got buffer: 2"):
        Asynchronous(concurrency=4, buffer=2, mixing=0.6)  # a mix over a buffer is no paper's method (issue 50)


def test_fedasyncs_staleness_offset_is_the_papers_t_minus_tau():
    """Xie et al. 2019 mix x_new (trained on x_τ) into x_t with s(t - τ), epochs from 1: lfed's τ_k + 1. With
    staleness_offset 1, hinge(a = 0.5, b = 4) weighs lfed's τ = 4 at s(5) = 1/1.5 (the paper's t - τ = 5), and a fresh
    update polynomial(a = 0.5) at 2^-1/2; the default keeps FedBuff's τ (s(4) = 1, s(0) = 1)."""
    paper = FedAsync(staleness="hinge", staleness_exponent=0.5, hinge_start=4, staleness_offset=1)
    assert paper.s(4) == pytest.approx(1 / 1.5, rel=1e-15) and paper.s(3) == 1.0
    assert FedAsync(staleness="hinge", staleness_exponent=0.5, hinge_start=4).s(4) == 1.0
    assert FedAsync(staleness="polynomial", staleness_offset=1).s(0) == pytest.approx(2 ** -0.5, rel=1e-15)
    with pytest.raises(ValueError, match="staleness_offset"):
        FedAsync(staleness_offset=-1)


@pytest.mark.parametrize("content, match", [("1.0\n-2.0\n3.0\n", "a duration must be positive"),
                                            ("1.0\nfast\n3.0\n", "'fast' is not a number"),
                                            ("1.0\n2.0\n", "holds 2 durations, the data has 3 clients")])
def test_a_bad_durations_file_is_refused_before_round_0(tmp_path, content, match):
    """The file is read and checked in the composition check before round 0 (0.4 read it at the first dispatch,
    after the run had started), naming the file and the line; a missing file too."""
    from lfed.base.component import CompositionContext

    path = tmp_path / "durations.txt"
    path.write_text(content)
    context = CompositionContext(frozenset(), num_clients=3, components={})
    with pytest.raises(ValueError, match=match):
        Asynchronous(concurrency=2, buffer=1, clock=SimulatedClock("file", durations_file=str(path))).check(context)
    with pytest.raises(ValueError, match="durations_file: .* is not a file"):
        Asynchronous(concurrency=2, buffer=1,
                     clock=SimulatedClock("file", durations_file=str(tmp_path / "none.txt"))).check(context)


# ----------------------------------------------------------------------------- the exactness of a run


def _data(tmp_path=None, seed=0, holdout=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(96, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (96,), generator=g)
    return FederatedDataModule.from_tensors(x, y, x[:12], y[:12], num_clients=N, partition="dirichlet", rho=0.5,
                                            holdout_fraction=holdout)


def _durations_file(tmp_path):
    g = torch.Generator().manual_seed(3)
    d = 0.5 + 4.0 * torch.rand(N, generator=g, dtype=torch.float64) ** 3  # distinct, a few slow clients
    path = tmp_path / "durations.txt"
    path.write_text("\n".join(repr(float(v)) for v in d))
    return path, d.tolist()


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(D, CLASSES).double()


def _hand_local(w, x, y, steps, lr, mu=0.0):
    """Full-batch gradient descent on one client's data, plain torch (layout: weight then bias); ``mu``: FedProx's
    proximal term, ``w ← w - lr (g + mu (w - w_start))`` (Li et al. 2020)."""
    start, w = w.clone(), w.clone()
    for _ in range(steps):
        v = w.detach().requires_grad_(True)
        loss = F.cross_entropy(x @ v[: CLASSES * D].view(CLASSES, D).T + v[CLASSES * D:], y)
        (g,) = torch.autograd.grad(loss, v)
        w = w - lr * (g + mu * (w - start))
    return w


def _hand_st(x, q):
    """Sparse ternary compression per tensor (weight, bias), plain torch: the k = floor(n q) (at least 1) entries of
    largest magnitude become ±(their mean magnitude), the rest 0. The server's Δ of ternary rows has many exactly tied
    magnitudes: ties are broken as torch.topk breaks them (what SPEC §7 specifies)."""
    out = []
    for seg in x.split([CLASSES * D, CLASSES]):
        k = max(int(seg.numel() * q + 1e-9), 1)
        top = torch.topk(seg.abs(), k, sorted=False).indices
        o = torch.zeros_like(seg)
        o[top] = seg.abs()[top].mean() * seg[top].sign()
        out.append(o)
    return torch.cat(out)


def _hand_draw(N, C, events, seed, t, windows):
    """The order in which step t offers idle clients (lfed.participation.sampling.uniform_draw, written out): with
    availability windows, or when the C - in flight clients to draw and the busy ones are more than N/2, the whole
    randperm(N) of (seed, t, "sample"); else batches of max(2m, 16) integers uniform in [0, N) from that generator (m
    still missing), each kept at its first appearance unless busy, until C - in flight are kept."""
    g = round_generator(seed, t, "sample")
    busy = {e[2] for e in events}
    k = C - len(events)
    if windows is not None or k + len(busy) > N / 2:
        return torch.randperm(N, generator=g).tolist()
    kept, seen = [], set(busy)
    while len(kept) < k:
        for c in torch.randint(0, N, (max(2 * (k - len(kept)), 16),), generator=g).tolist():
            if c not in seen:
                seen.add(c)
                kept.append(c)
                if len(kept) == k:
                    break
    return kept


def _hand_dispatch(t, now, events, C, M, perm, durations, opens):
    """Who starts when at server step t: the clients available at a time (perm order) fill the free slots; while
    slots are free and fewer than M arrivals are due before it, wait for the next window opening (FedScale's rule)."""
    left = [c for c in perm if c not in {e[2] for e in events}]
    free = C - len(events)
    due = sorted(e[0] for e in events)
    starts, clock = {}, now
    while len(starts) < free and left:
        ready = [c for c in left if opens(c, now) <= clock][: free - len(starts)]
        for c in ready:
            starts[c] = clock
            due = sorted(due + [clock + durations[c]])
        left = [c for c in left if c not in starts]
        if len(starts) == free or not left:
            break
        nxt = min(opens(c, now) for c in left)
        if nxt >= (due[M - 1] if len(due) >= M else math.inf):
            break
        clock = nxt
    return starts


def _hand_simulation(data, w0, durations, *, C, M, steps, lr, rounds, seed, server, windows=None, q=None, mu=0.0):
    """The event simulation of FedBuff / FedAsync: a heap over arrival times (module docstring). ``windows``:
    ``(period, fraction)`` availability windows; ``q``: ternary compression with error feedback both ways; ``mu``:
    FedProx's local objective."""
    x, y, index, sizes = data.train_x, data.train_y, data.client_index, data.client_sizes
    w, now, seq, events, taus = w0.clone(), 0.0, 0, [], []
    m_a = v_a = None
    residual, server_residual = {}, torch.zeros_like(w0)
    delayed = idle = 0
    if windows is not None:
        period, fraction = windows
        phase = period * torch.rand(N, generator=round_generator(seed, 0, "clock_window"), dtype=torch.float64)

        def opens(c, t):  # t while client c's window is open, else its next opening
            r = float(torch.remainder(torch.tensor(t - float(phase[c]), dtype=torch.float64), period))
            return t if r < fraction * period else t + (period - r)
    else:
        def opens(c, t):
            return t
    for t in range(rounds):
        perm = _hand_draw(N, C, events, seed, t, windows)
        starts = _hand_dispatch(t, now, events, C, M, perm, durations, opens)
        delayed += sum(v > now for v in starts.values())
        idle += not starts
        for c in sorted(starts):
            rows = index[c, : sizes[c]]
            w_c = _hand_local(w, x[rows], y[rows], steps, lr, mu)
            heapq.heappush(events, (starts[c] + durations[c], seq, c, t, w_c if server[0] == "fedasync" else w_c - w))
            seq += 1
        popped = [heapq.heappop(events) for _ in range(M)]
        now = popped[-1][0]
        taus += [t - e[3] for e in popped]
        if q is not None:  # each arriving client sends ST(R_k + Δ_k) and keeps the rest (Sattler et al. / EFL)
            sent = []
            for e in popped:
                u = residual.get(e[2], torch.zeros_like(w0)) + e[4]
                sent.append(_hand_st(u, q))
                residual[e[2]] = u - sent[-1]
            popped = [(*e[:4], s_) for e, s_ in zip(popped, sent)]
        if server[0] == "fedbuff":  # Nguyen et al. 2022, Alg. 1: w ← w + η_g (1/M) Σ s(τ) Δ_k, s = (1 + τ)^-1/2
            _, eta = server
            delta = sum((1 + t - e[3]) ** -0.5 / M * e[4] for e in popped)
            if q is not None:  # the server broadcasts ST(R_G + Δ) and keeps the rest
                u = server_residual + delta
                delta = _hand_st(u, q)
                server_residual = u - delta
            w = w + eta * delta
        elif server[0] == "fedbuff_fedadam":  # the same Δ into Reddi et al.'s FedAdam (no bias correction, v_0 = τ²)
            _, lr_s, b1, b2, tau_a = server
            delta = sum((1 + t - e[3]) ** -0.5 * e[4] for e in popped) / M
            if t == 0:
                m_a, v_a = torch.zeros_like(w), torch.full_like(w, tau_a**2)
            m_a = b1 * m_a + (1 - b1) * delta
            v_a = b2 * v_a + (1 - b2) * delta**2
            w = w + lr_s * m_a / (v_a.sqrt() + tau_a)
        else:  # Xie et al. 2019: w ← (1 - α s) w + α s w_k, hinge s
            _, alpha, a, b = server
            (e,) = popped
            tau = t - e[3]
            s = 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)
            w = (1 - alpha * s) * w + alpha * s * e[4]
    if windows is not None:
        return w, now, taus, delayed, idle
    return w, now, taus


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["fedbuff", "fedasync", "fedbuff_fedadam", "fedbuff_prox"])
def test_twenty_server_steps_equal_the_hand_event_simulation(tmp_path, backend, kind):
    path, durations = _durations_file(tmp_path)
    clock = SimulatedClock("file", durations_file=str(path))
    dm = _data()
    data = dm.build()
    net = _net()
    w0 = torch.cat([net.weight.detach().flatten(), net.bias.detach().flatten()])
    mu, objective = (0.5, "prox") if kind == "fedbuff_prox" else (0.0, None)
    if kind in ("fedbuff", "fedbuff_prox"):
        asynchronous = FedBuff(concurrency=5, buffer=2, clock=clock)
        server, optimizer = ("fedbuff", 1.5), functools.partial(torch.optim.SGD, lr=1.5)
        C, M = 5, 2
    elif kind == "fedbuff_fedadam":
        from lfed.server.optimizers import FedAdam

        asynchronous = FedBuff(concurrency=5, buffer=2, clock=clock)
        server = ("fedbuff_fedadam", 0.05, 0.9, 0.99, 0.01)
        optimizer = functools.partial(FedAdam, lr=0.05, betas=(0.9, 0.99), tau=0.01)
        C, M = 5, 2
    else:
        asynchronous = FedAsync(concurrency=4, mixing=0.6, staleness="hinge", staleness_exponent=0.5, hinge_start=1,
                                clock=clock)
        server, optimizer = ("fedasync", 0.6, 0.5, 1), None
        C, M = 4, 1
    module = FederatedModule(net, weighting="uniform", training=dict(client_lr=0.3, batch_size=None, local_steps=2), engine=dict(backend=backend),
                             seed=4, server_optimizer=optimizer, asynchronous=asynchronous,
                             objective=None if objective is None else Prox(mu=mu))
    run_rounds(module, dm, rounds=20)
    want, now, taus = _hand_simulation(data, w0, durations, C=C, M=M, steps=2, lr=0.3, rounds=20, seed=4, server=server,
                                       mu=mu)
    assert max(taus) >= 3  # stale updates were aggregated (and the hinge's tail was used)
    torch.testing.assert_close(flat_weights(module), want, atol=1e-12, rtol=0)
    assert module.runs[0].components.asynchronous.now == now and len(asynchronous.times) == 20
    assert len(asynchronous.events) == C - M and module.comm.uploads == 20 * M


@pytest.mark.parametrize("backend", BACKENDS)
def test_availability_windows_equal_the_hand_event_simulation(tmp_path, backend):
    """FedBuff C = 5, M = 2 with periodic availability windows (period 6 s, available 25% of it): a client outside
    its window is not drawn; the server waits for a window to open while fewer than M arrivals precede it, and
    some steps dispatch nobody. 20 server steps against the hand event simulation."""
    path, durations = _durations_file(tmp_path)
    clock = SimulatedClock("file", durations_file=str(path), availability_period=6.0, availability_fraction=0.25)
    dm = _data()
    data = dm.build()
    net = _net()
    w0 = torch.cat([net.weight.detach().flatten(), net.bias.detach().flatten()])
    asynchronous = FedBuff(concurrency=5, buffer=2, clock=clock)
    module = FederatedModule(net, weighting="uniform", training=dict(client_lr=0.3, batch_size=None, local_steps=2), engine=dict(backend=backend),
                             seed=4, server_optimizer=functools.partial(torch.optim.SGD, lr=1.5), asynchronous=asynchronous)
    run_rounds(module, dm, rounds=20)
    want, now, taus, delayed, idle = _hand_simulation(data, w0, durations, C=5, M=2, steps=2, lr=0.3, rounds=20, seed=4,
                                                      server=("fedbuff", 1.5), windows=(6.0, 0.25))
    assert delayed >= 3 and idle >= 1 and max(taus) >= 3  # the server waited for windows; a step dispatched nobody
    torch.testing.assert_close(flat_weights(module), want, atol=1e-12, rtol=0)
    assert asynchronous.now == pytest.approx(now, abs=1e-9) and module.comm.uploads == 40


@pytest.mark.parametrize("backend", BACKENDS)
def test_fedbuff_with_ternary_compression_equals_the_hand_event_simulation(tmp_path, backend):
    """Compression composes with FedBuff: an arriving client sends ST(R_k + Δ_k) of its own (stale) update and keeps
    the rest as its residual, the server broadcasts ST(R_G + Δ); 20 server steps against the hand simulation."""
    path, durations = _durations_file(tmp_path)
    dm = _data()
    data = dm.build()
    net = _net()
    w0 = torch.cat([net.weight.detach().flatten(), net.bias.detach().flatten()])
    asynchronous = FedBuff(concurrency=5, buffer=2, clock=SimulatedClock("file", durations_file=str(path)))
    module = FederatedModule(net, weighting="uniform", training=dict(client_lr=0.3, batch_size=None, local_steps=2), engine=dict(backend=backend),
                             seed=4, server_optimizer=functools.partial(torch.optim.SGD, lr=1.5), asynchronous=asynchronous,
                             channel=0.4)
    run_rounds(module, dm, rounds=20)
    want, now, taus = _hand_simulation(data, w0, durations, C=5, M=2, steps=2, lr=0.3, rounds=20, seed=4,
                                       server=("fedbuff", 1.5), q=0.4)
    assert max(taus) >= 3
    torch.testing.assert_close(flat_weights(module), want, atol=1e-12, rtol=0)
    assert module.comm.uploads == 40 and module.comm.bits_up < 40 * 32 * (CLASSES * D + CLASSES)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("placement", ["device", "host"])
def test_sync_fedavg_is_the_case_c_equals_m_equals_k_with_equal_durations(backend, placement):
    """C = M = K = 3 of 12 clients, equal durations (constant clock, 2 local steps each), size weights, mini-batches:
    FedAvg bit for bit."""
    rounds = 6
    sync = FederatedModule(_net(1), fraction=0.25, training=dict(client_lr=0.2, batch_size=3, local_steps=2), engine=dict(backend=backend))
    run_rounds(sync, _data(), rounds=rounds)
    asynchronous = FedBuff(concurrency=3, buffer=3, clock=SimulatedClock("constant", time_per_step=0.5))
    a = FederatedModule(_net(1), training=dict(client_lr=0.2, batch_size=3, local_steps=2),
                        engine=dict(backend=backend, client_state=placement), asynchronous=asynchronous)
    run_rounds(a, _data(), rounds=rounds)
    assert torch.equal(flat_weights(a), flat_weights(sync))
    assert a.comm.uploads == sync.comm.uploads == rounds * 3
    assert asynchronous.events == [] and asynchronous.times == [float(t) for t in range(1, rounds + 1)]


def _bn_net(seed=0):
    """BatchNorm first (momentum 0.1): a client's running statistics depend on its data alone, not on the weights."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.BatchNorm1d(D), nn.Linear(D, CLASSES)).double()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fedbuff_aggregates_the_arrivals_batchnorm_statistics_by_hand(tmp_path, backend):
    """Each server step sets the global BatchNorm statistics as a synchronous round does, from the arrivals: the
    floating ones their mean with FedBuff's weights n_k s(τ_k) normalised, num_batches_tracked their largest. With two
    full-batch steps at momentum f = 0.1, a client dispatched with the global (r, v, t) brings back
    ((1 - f)² r + (1 - (1 - f)²) μ_k, (1 - f)² v + (1 - (1 - f)²) σ²_k (unbiased), t + 2), whenever it arrives."""
    path, durations = _durations_file(tmp_path)
    C, M, rounds, seed = 3, 2, 4, 4
    asynchronous = FedBuff(concurrency=C, buffer=M, clock=SimulatedClock("file", durations_file=str(path)))
    module = FederatedModule(_bn_net(), training=dict(client_lr=0.3, batch_size=None, local_steps=2),
                             engine=dict(backend=backend), seed=seed, asynchronous=asynchronous)
    run_rounds(module, _data(), rounds=rounds)
    data = _data().build()
    x, index, sizes = data.train_x, data.client_index, data.client_sizes.tolist()
    r, v, t = torch.zeros(D, dtype=torch.float64), torch.ones(D, dtype=torch.float64), 0  # torch's initial statistics
    events, seq, now, taus = [], 0, 0.0, []
    for step in range(rounds):
        perm = _hand_draw(N, C, events, seed, step, None)
        starts = _hand_dispatch(step, now, events, C, M, perm, durations, lambda c, at: at)
        for c in sorted(starts):
            xc = x[index[c, : sizes[c]]]
            brought = (0.81 * r + 0.19 * xc.mean(0), 0.81 * v + 0.19 * xc.var(0, unbiased=True), t + 2)
            heapq.heappush(events, (starts[c] + durations[c], seq, c, step, brought))
            seq += 1
        popped = [heapq.heappop(events) for _ in range(M)]
        now = popped[-1][0]
        taus += [step - e[3] for e in popped]
        a = [sizes[e[2]] * (1 + step - e[3]) ** -0.5 for e in popped]  # size weights times FedBuff's s(τ)
        r = sum(w * e[4][0] for w, e in zip(a, popped)) / sum(a)
        v = sum(w * e[4][1] for w, e in zip(a, popped)) / sum(a)
        t = max(e[4][2] for e in popped)
    assert max(taus) >= 1  # a stale arrival brought statistics that started from an older global model's
    bn = module.runs[0].net[0]
    torch.testing.assert_close(bn.running_mean, r, atol=1e-14, rtol=0)
    torch.testing.assert_close(bn.running_var, v, atol=1e-14, rtol=0)
    assert bn.num_batches_tracked.item() == t == 2 * rounds  # every arrival tracked t + 2 from the global t


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_batchnorm_statistics_are_the_synchronous_rounds_in_the_sync_case(backend):
    """C = M = K = 3 of 12 clients with equal durations: the global model's every buffer is FedAvg's, bit for bit."""
    rounds = 3
    sync = FederatedModule(_bn_net(1), fraction=0.25, training=dict(client_lr=0.2, batch_size=None, local_steps=2),
                           engine=dict(backend=backend))
    run_rounds(sync, _data(), rounds=rounds)
    a = FederatedModule(_bn_net(1), training=dict(client_lr=0.2, batch_size=None, local_steps=2), engine=dict(backend=backend),
                        asynchronous=FedBuff(concurrency=3, buffer=3, clock=SimulatedClock("constant")))
    run_rounds(a, _data(), rounds=rounds)
    assert torch.equal(flat_weights(a), flat_weights(sync))
    want = dict(sync.runs[0].net.named_buffers())
    assert want["0.num_batches_tracked"].item() == 2 * rounds
    for name, b in a.runs[0].net.named_buffers():
        assert torch.equal(b, want[name]), name


def _local_means(module) -> list:
    """The mean local accuracy each step hands to bmta (SPEC §9), recorded."""
    run, seen = module.runs[0], []
    add = run.bmta.add_round
    run.bmta.add_round = lambda clients, local: seen.append(local) or add(clients, local)
    return seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_local_accuracy_of_the_arrivals_is_the_synchronous_rounds_in_the_sync_case(backend):
    """client/local_acc_mean and bmta_local (SPEC §9): each arrival's w_k scored on its own held-out split when it
    was dispatched, reported when it arrives; with C = M = K and equal durations, step for step the synchronous
    round's (which scores its cohort's w_k after the round)."""
    rounds = 5
    sync = FederatedModule(_net(1), fraction=0.25, training=dict(client_lr=0.2, batch_size=3, local_steps=2), engine=dict(backend=backend))
    want = _local_means(sync)
    run_rounds(sync, _data(holdout=0.3), rounds=rounds)
    a = FederatedModule(_net(1), training=dict(client_lr=0.2, batch_size=3, local_steps=2), engine=dict(backend=backend),
                        asynchronous=FedBuff(concurrency=3, buffer=3, clock=SimulatedClock("constant")))
    got = _local_means(a)
    run_rounds(a, _data(holdout=0.3), rounds=rounds)
    assert len(want) == rounds and all(isinstance(v, float) for v in want) and len(set(want)) > 1
    assert got == want
    assert a.runs[0].bmta.summary()["final/bmta_local"] == sync.runs[0].bmta.summary()["final/bmta_local"]


def test_the_arrivals_local_accuracies_are_in_the_checkpoint():
    a = FedBuff(concurrency=3, buffer=1, clock=SimulatedClock("constant"))
    a.local_acc = torch.tensor([0.5, math.nan, 0.25], dtype=torch.float64)
    b = FedBuff(concurrency=3, buffer=1, clock=SimulatedClock("constant"))
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.local_acc.nan_to_num(-1), a.local_acc.nan_to_num(-1))
    b.set_extra_state({"events": [], "seq": 0, "times": []})  # a checkpoint from before it was kept
    assert b.local_acc is None


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"algorithm": "scaffold"}, "asynchronous: objective: Scaffold"),
        ({"algorithm": "dp_fedavg"}, "asynchronous: combination: DPFedAvg is not implemented asynchronously"),
        ({"combination": "self"}, "asynchronous: combination: IGFLAttention"),
        ({"weighting": "dwfed"}, r"asynchronous: weighting: DWFedWeights \('dwfed'\) is not defined asynchronously yet; use size or uniform$"),
        ({"sampler": "attention"}, "asynchronous: sampler: AttentionSampler"),
        ({"stragglers": {"p_inactive": 0.2}}, "asynchronous: p_inactive"),
        ({"channel": 0.3, "asynchronous": FedAsync(concurrency=4)}, "asynchronous: channel: FedAsync mixes"),
        ({"objective": "lfed.client.feddyn.FedDyn"}, "asynchronous: objective: FedDyn"),
        ({"objective": "lfed.personal.ditto.Ditto"}, "asynchronous: objective: Ditto"),
        ({"asynchronous": FedBuff(concurrency=13, buffer=2)}, "asynchronous: concurrency: 13 clients in flight"),
        ({"combination": "krum"}, "asynchronous: combination: Krum is a robust rule over one round's cohort"),
        ({"attack": "sign_flip"}, "asynchronous: attack: SignFlip is simulated on a synchronous round's cohort"),
    ],
)
def test_compositions_that_are_not_defined_asynchronously_are_refused_before_round_0(settings, expected):
    settings = {"asynchronous": FedBuff(concurrency=4, buffer=2), **settings}
    module = FederatedModule(_net(), training=dict(client_lr=0.1, batch_size=None, local_steps=1), **settings)
    with pytest.raises(ValueError, match=expected) as info:
        run_rounds(module, _data(), rounds=1)
    assert "\n" not in str(info.value)
    assert module.runs[0].rounds_done == 0


def test_a_component_says_itself_whether_it_is_defined_asynchronously():
    """The asynchronous component asks each other component (lfed.core.asynchronous.asynchronous_refusal), by no name: a user's
    combination that declares asynchronous_ready runs, and equals the built-in mean; a subclass of a ready class
    that does not declare it again (it may compute something else) is refused before round 0 with its own name."""
    from lfed.server.combination import Mean

    class MyMean(Mean):  # same arithmetic, but it has not said it is defined on stale updates
        pass

    class DeclaredMean(Mean):
        declares = Declaration(supports=Supports(asynchronous=True))

    def fit(combination):
        module = FederatedModule(_net(), combination=combination, training=dict(client_lr=0.1, batch_size=None, local_steps=1),
                                 asynchronous=FedBuff(concurrency=4, buffer=2, clock=SimulatedClock("constant")))
        run_rounds(module, _data(), rounds=3)
        return module

    with pytest.raises(ValueError, match=r"^asynchronous: combination: MyMean is not defined on a buffer of stale "
                                         r"updates yet; use mean$"):
        fit(MyMean())
    assert torch.equal(flat_weights(fit(DeclaredMean())), flat_weights(fit("mean")))


def test_what_only_the_asynchronous_schedule_reads_is_not_on_the_component_base():
    """Issue 50: the declarations are read by lfed.core.asynchronous, not carried by every component: the default
    refusal names the class; a class's own Supports(asynchronous=True) lifts it (not inherited); a reason it declares
    follows its class name, inherited. (0.5's spellings: tests/base/test_declaration.py.)"""
    from lfed.base.component import Component
    from lfed.core.asynchronous import asynchronous_refusal, declared_refusal

    assert not any(hasattr(Component, a) for a in ("asynchronous_ready", "asynchronous_unready", "asynchronous_refusal"))

    class Mine(Component):
        pass

    class Ready(Component):
        declares = Declaration(supports=Supports(asynchronous=True))

    class ReadyChild(Ready):
        pass

    class Says(Component):
        declares = Declaration(supports=Supports(asynchronous="is not under FedBuff"))

    class SaysChild(Says):
        pass

    schedule = FedBuff(concurrency=2, buffer=1)
    assert asynchronous_refusal(Mine(), schedule) == "Mine is not defined asynchronously yet"
    assert asynchronous_refusal(Ready(), schedule) is None
    assert asynchronous_refusal(ReadyChild(), schedule) == "ReadyChild is not defined asynchronously yet"  # not inherited
    assert asynchronous_refusal(Says(), schedule) == "Says is not under FedBuff" == declared_refusal(Says())
    assert asynchronous_refusal(SaysChild(), schedule) == "SaysChild is not under FedBuff"  # a reason is inherited


def test_a_dispatch_that_diverges_stops_the_run_naming_the_dispatched_clients():
    """NaN in the results of the clients dispatched at a step (C = 6 of them; the buffer pops M = 2) stops the run
    before the bad numbers are kept, naming dispatched clients (it once failed with an IndexError: their rows were
    named by the popped cohort's 2 ids), and the global model stays the last good one."""
    asynchronous = FedBuff(concurrency=6, buffer=2, clock=SimulatedClock("constant"))
    module = FederatedModule(_net(), training=dict(client_lr=1e308, batch_size=None, local_steps=3), asynchronous=asynchronous)
    w0 = flat_weights(module).clone()
    with pytest.raises(FloatingPointError, match=r"^round 0: training losses contain NaN or Inf from clients \[") as info:
        run_rounds(module, _data(), rounds=2)
    dispatched = [c for c, *_ in asynchronous._plan]
    named = [int(c) for c in str(info.value).split("from clients [")[1].split("]")[0].split(",")]
    assert len(dispatched) == 6 and set(named) <= set(dispatched)
    assert module.runs[0].rounds_done == 0 and torch.equal(flat_weights(module), w0)


def test_dispatches_go_only_to_the_clients_online_on_a_trace_at_their_start(tmp_path):
    """FedBuff C = 4, M = 2 on the tiny trace of tests/participation/test_traces.py (N = 12: client k reads the trace's
    k mod 5), every participation 12 simulated s: each client starts at a time it is online (read off the trace by
    hand), and the server waits through the trace's gap [50, 60) where nobody is."""
    from test_traces import _online_by_hand, _write_trace

    from lfed.core.algorithm import LocalTraining
    from lfed.core.fit import fit_run
    from lfed.core.settings import build_run

    clock = SimulatedClock("constant", time_per_step=6.0, trace=_write_trace(tmp_path / "behave.json"))
    fedbuff = FedBuff(concurrency=4, buffer=2, clock=clock)
    plans = []
    plan = fedbuff._dispatch_plan

    def recorded(run, step):
        out = plan(run, step)
        plans.append((step, fedbuff.now, out))
        return out

    fedbuff._dispatch_plan = recorded
    run = build_run(net=_net(), asynchronous=fedbuff, seed=2, training=LocalTraining(client_lr=0.1, local_steps=2))
    history = fit_run(run, _data(), 20)
    starts = [(c, start) for _, _, p in plans for c, start, _, _ in p]
    assert len(starts) >= 4 + 2 * 16  # C at step 0, then M a step (fewer while nobody is online)
    for step, now, p in plans:
        for c, start, d, steps in p:
            assert start >= now and c % 5 in _online_by_hand(start), (step, c, start)
            assert d == 12.0 and steps == 2
    assert any(start == 60.0 for _, start in starts)  # dispatched when the gap ends
    assert not any(50.0 <= start % 100.0 < 60.0 for _, start in starts)
    assert history[-1]["clock/time"] > 100.0  # the run went round the trace's period


# ----------------------------------------------------------------------------- exact resume


ASYNC = {"class_path": "lfed.core.asynchronous.FedBuff",
         "init_args": {"concurrency": 6, "buffer": 2, "clock": {"class_path": "lfed.participation.clock.SimulatedClock",
                                                                "init_args": {"distribution": "lognormal",
                                                                              "speed_sigma": 1.0, "jitter_sigma": 0.2}}}}


#: the same, with availability windows (each client free 30% of every 20 simulated s): steps that wait for a window
WINDOWS = {**ASYNC, "init_args": {**ASYNC["init_args"], "clock": {"class_path": "lfed.participation.clock.SimulatedClock", "init_args": {
    **ASYNC["init_args"]["clock"]["init_args"], "availability_period": 20.0, "availability_fraction": 0.3}}}}


def _async_state(cli) -> dict:
    from test_checkpoint import run_state

    state = run_state(cli)
    a = cli.model.runs[0].components.asynchronous
    state["async"] = (a.events, a.seq, a.times, a.clock.now)
    return state


@pytest.mark.bitlevel
@pytest.mark.parametrize("placement, clock", [("device", ASYNC), ("host", ASYNC), ("disk", ASYNC), ("host", WINDOWS)],
                         ids=["device", "host", "disk", "host-windows"])
def test_resume_from_a_middle_checkpoint_with_clients_in_flight_is_bit_identical(tmp_path, placement, clock):
    """FedBuff C = 6, M = 2 on digits, log-normal clock (and availability windows): resumed at server step 3 with 4
    clients in flight."""
    from test_checkpoint import assert_same_state, fit, load, write_config

    keep_all = {"callbacks": [{"class_path": "lfed.lightning.checkpoint.RoundCheckpoint",
                               "init_args": {"dirpath": str(tmp_path / "ckpts"), "every_n_train_steps": 3, "save_top_k": -1}}]}
    config = write_config(tmp_path / "cfg.yaml", "fedavg", trainer=keep_all, asynchronous=clock, engine={"client_state": placement},
                          fraction=None)
    want = _async_state(fit(config))
    middle = load(tmp_path / "ckpts" / "epoch=0-step=3.ckpt")
    assert middle["global_step"] == 3
    # in flight, with their rows (with windows one slot is free: its next client's window has not opened)
    assert len(middle["state_dict"]["asynchronous._extra_state"]["events"]) == (4 if clock is ASYNC else 3)
    assert middle["state_dict"]["asynchronous.update.rows"].shape[0] == 6  # every slot written once by then
    assert middle["state_dict"]["asynchronous.clock._extra_state"]["now"] > 0
    got = _async_state(fit(config, "--ckpt_path", str(tmp_path / "ckpts" / "epoch=0-step=3.ckpt")))
    assert got["async"][0] and got["async"] == want["async"]
    assert_same_state(got, want)


def test_resume_with_batchnorm_statistics_in_flight_is_bit_identical(tmp_path):
    """The slots' BatchNorm statistics (asynchronous.stats) are in the checkpoint: resumed at server step 3 with 4
    clients in flight, the run ends with the uninterrupted run's weights and every buffer."""
    from test_checkpoint import assert_same_state, fit, load, write_config

    keep_all = {"callbacks": [{"class_path": "lfed.lightning.checkpoint.RoundCheckpoint",
                               "init_args": {"dirpath": str(tmp_path / "ckpts"), "every_n_train_steps": 3, "save_top_k": -1}}]}
    net = {"class_path": "lfed.models.ResNet20", "init_args": {"in_channels": 1, "depth": 8, "width": 2}}
    config = write_config(tmp_path / "cfg.yaml", "fedavg", trainer=keep_all, asynchronous=ASYNC, engine={"client_state": "host"},
                          fraction=None, net=net)
    want = _async_state(fit(config))
    middle = load(tmp_path / "ckpts" / "epoch=0-step=3.ckpt")
    assert middle["state_dict"]["asynchronous.stats"].shape[0] == 6  # one row per slot
    got = _async_state(fit(config, "--ckpt_path", str(tmp_path / "ckpts" / "epoch=0-step=3.ckpt")))
    assert got["async"] == want["async"] and any(k.endswith("running_mean") for k in want)
    assert_same_state(got, want)


@pytest.mark.bitlevel
def test_resume_of_a_run_on_availability_and_device_traces_is_bit_identical(tmp_path):
    """FedBuff C = 6, M = 2 on digits, availability and durations from FedScale-format traces (availability from a
    JSON trace, durations from a device-capacity trace): resumed at server step 3, it ends as the uninterrupted run."""
    from test_checkpoint import assert_same_state, fit, load, write_config
    from test_traces import _digits_trace

    clock = _digits_trace(tmp_path)["init_args"]["clock"]
    fedbuff = {**ASYNC, "init_args": {**ASYNC["init_args"], "clock": clock}}
    keep_all = {"callbacks": [{"class_path": "lfed.lightning.checkpoint.RoundCheckpoint",
                               "init_args": {"dirpath": str(tmp_path / "ckpts"), "every_n_train_steps": 3, "save_top_k": -1}}]}
    config = write_config(tmp_path / "cfg.yaml", "fedavg", trainer=keep_all, asynchronous=fedbuff, fraction=None)
    want = _async_state(fit(config))
    middle = load(tmp_path / "ckpts" / "epoch=0-step=3.ckpt")
    assert middle["state_dict"]["asynchronous._extra_state"]["events"]  # clients in flight
    assert 0 < middle["state_dict"]["asynchronous.clock._extra_state"]["now"] < want["async"][3]
    got = _async_state(fit(config, "--ckpt_path", str(tmp_path / "ckpts" / "epoch=0-step=3.ckpt")))
    assert got["async"] == want["async"]
    assert_same_state(got, want)


def test_sigkill_mid_run_then_resume_last_is_bit_identical(tmp_path):
    from resume_helpers import RoundLog
    from test_checkpoint import ROUNDS, assert_same_state, checkpoint_dir, fit, kill_when_holding, load, start_lfed, write_config

    ref_dir, kill_dir = tmp_path / "ref", tmp_path / "killed"
    ref_dir.mkdir(), kill_dir.mkdir()
    want = _async_state(fit(write_config(ref_dir / "cfg.yaml", "fedavg", asynchronous=ASYNC, fraction=None)))
    config = write_config(kill_dir / "cfg.yaml", "fedavg", asynchronous=ASYNC, fraction=None)
    kill_when_holding(start_lfed(config, "--trainer.callbacks+=resume_helpers.HoldInRound", "--trainer.callbacks.round=4"))
    last = checkpoint_dir(kill_dir / "run") / "last.ckpt"
    assert load(last)["global_step"] == ROUNDS // 2
    resumed = fit(config, "--ckpt_path", "last", "--trainer.callbacks+=resume_helpers.RoundLog")
    log = next(c for c in resumed.trainer.callbacks if isinstance(c, RoundLog))
    assert log.rounds == [3, 4, 5]
    got = _async_state(resumed)
    assert got["async"] == want["async"]
    assert_same_state(got, want)


def test_the_digits_config_runs_and_reports_simulated_time(tmp_path):
    from conftest import REPO

    from lfed.lightning.cli import run_cli

    cli = run_cli(["fit", "--config", str(REPO / "configs" / "fedbuff_digits.yaml"), "--trainer.logger=false",
                   "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
                   f"--trainer.default_root_dir={tmp_path}", "--model.evaluation.accuracy_targets=[0.2]"])
    a = cli.model.runs[0].components.asynchronous
    summary = cli.model.final_summary
    assert len(a.times) == 60 and a.times == sorted(a.times) and len(a.events) == 5
    assert summary["final/simulated_time"] == a.times[-1]
    assert cli.trainer.callback_metrics["clock/time"].item() == pytest.approx(a.times[-1], rel=1e-6)  # logged as float32
    hit = cli.model.comm.rounds_to_reach(0.2)
    assert summary["final/time_to_0.2"] == a.times[hit[0] - 1]
    assert summary["final/uploads_total"] == 60 * 5 and summary["final/test_acc"] > 0.5


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--model.objective", "scaffold"], "model.asynchronous: objective: Scaffold keeps client or server state"),
        (["--model.objective", "lfed.client.feddyn.FedDyn"], "model.asynchronous: objective: FedDyn"),
        (["--model.algorithm", "ditto"], "model.asynchronous: objective: Ditto"),
        (["--model.asynchronous", "lfed.core.asynchronous.FedAsync", "--model.channel", "0.1"],
         "model.asynchronous: channel: FedAsync mixes the client's model"),
    ],
)
def test_a_user_asking_the_digits_config_for_what_async_does_not_define_gets_one_line(extra, expected, tmp_path,
                                                                                       monkeypatch, capsys):
    """``lfed fit --config configs/fedbuff_digits.yaml --model.objective scaffold``: one line, exit 2, no run left."""
    from conftest import REPO
    from test_cli_errors import run_main
    from test_cli_promises import one_error_line, runs_left

    code, err = run_main(monkeypatch, capsys, ["fit", "--config", str(REPO / "configs" / "fedbuff_digits.yaml"), *extra,
                                               "--trainer.max_steps", "1", "--trainer.enable_progress_bar", "false",
                                               "--trainer.default_root_dir", str(tmp_path)])
    assert code == 2
    assert one_error_line(err).startswith(f"lfed fit: error: {expected}")
    assert runs_left(tmp_path) == []


def test_the_digits_config_with_availability_windows_and_compression_runs(tmp_path):
    """What composes, as a user writes it: windows on the config's clock and ternary compression (FedBuff)."""
    from conftest import REPO

    from lfed.lightning.cli import run_cli

    cli = run_cli(["fit", "--config", str(REPO / "configs" / "fedbuff_digits.yaml"), "--trainer.logger=false",
                   "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false", "--trainer.max_steps=6",
                   "--trainer.val_check_interval=6", f"--trainer.default_root_dir={tmp_path}", "--model.channel=0.1",
                   "--model.asynchronous.init_args.clock.init_args.availability_period=100",
                   "--model.asynchronous.init_args.clock.init_args.availability_fraction=0.3"])
    a = cli.model.runs[0].components.asynchronous
    assert a.clock.windows and a.clock.availability_period == 100.0 and len(a.times) == 6
    assert type(cli.model.runs[0].components.channel).__name__ == "TernaryTopK"
    assert cli.model.comm.uploads == 30


WINDOWED_CLOCK = ["--model.asynchronous.init_args.clock", "lfed.participation.clock.SimulatedClock",
                  "--model.asynchronous.init_args.clock.init_args.availability_period", "20",
                  "--model.asynchronous.init_args.clock.init_args.availability_fraction", "0.3"]


#: FedBuff on 2 processes: always available, and with availability windows (steps that dispatch nobody).
DDP_CASES = {name: ["--model.asynchronous", "lfed.core.asynchronous.FedBuff", "--model.asynchronous.init_args.concurrency",
                    "5", "--model.asynchronous.init_args.buffer", "2", "--model.engine.client_state", "host", *clock]
             for name, clock in (("always-available", []), ("windows", WINDOWED_CLOCK))}


@pytest.fixture(scope="module")
def ddp_batch(tmp_path_factory):
    """Both cases on the same 2 processes, one launch (test_distributed.batch_of)."""
    from test_distributed import batch_of

    return batch_of(tmp_path_factory, DDP_CASES)


@pytest.mark.parametrize("case", list(DDP_CASES))
def test_two_processes_give_the_one_process_async_run(tmp_path, case, ddp_batch):
    """DDP 2 processes = 1 (docs/distributed.md): each server step's dispatched cohort is split over the ranks and
    gathered, every rank keeps the same queue, clock and slot rows (ReplicaCheck after every step); with availability
    windows too (steps that dispatch nobody)."""
    from test_distributed import _assert_same_state, _one_process

    root, logs = ddp_batch
    assert "ReplicaCheck: the state of all 2 ranks was identical at each of 4 checks" in logs[case]
    ddp = torch.load(root / case / "ckpt" / "end.ckpt", map_location="cpu", weights_only=False)
    one = _one_process(tmp_path, DDP_CASES[case], "one")
    state = {k: v.cpu() if torch.is_tensor(v) else v for k, v in one.model.state_dict().items()}
    assert ddp["state_dict"]["asynchronous._extra_state"]["events"]  # clients in flight at the end
    _assert_same_state(ddp["state_dict"], state, "async: 2 processes vs 1")


@pytest.mark.usefixtures("one_thread")
def test_a_grid_of_async_runs_equals_each_run_alone(tmp_path):
    """lfed grid: the members' dispatched clients are trained in one engine call per server step (lfed.core.lockstep),
    each member bit for bit its run alone (float64, one thread)."""
    from test_group import F64, assert_members_equal_alone, config

    assert_members_equal_alone([config("fedbuff_digits.yaml")], {"model.training.client_lr": [0.05, 0.1], "model.seed": [0, 1]},
                               ["--trainer.max_steps=4", "--trainer.val_check_interval=2", *F64], tmp_path,
                               merged_calls_per_round=1)
