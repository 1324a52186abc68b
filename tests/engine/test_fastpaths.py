"""CohortTrainer's fast paths give the eager, one-client-at-a-time results (docs/reproducibility.md).

The vmap backend replays a recorded graph of its local step, orders clients by steps done and
updates weights in place; the loop backend trains a private copy of the model; on a CPU cohorts
are chunked. The recorded step changes no bit of the eager one (the same products of the same
shapes). Chunks of other sizes run products of other shapes: with one intra-op thread they change
no bit either (tests marked ``bitlevel``, checked under every CPU capability by
scripts/portability.sh); with several threads the BLAS may split the two shapes' products
differently, and the results agree to the contract's tolerance (``conftest.CROSS_MACHINE``).
"""

import pytest
import torch
from conftest import assert_within
from torch import nn

from lfed.engine import CohortTrainer, StepRule
from lfed.models.zoo import MLP, ReddiEMNISTCNN


def _data(n, shape, classes, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g, dtype=dtype), torch.randint(0, classes, (n,), generator=g)


def _index(K, n, total, seed=1):
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    return perm[: K * n].view(K, n)


def _run(trainer, w0, X, Y, idx, steps, rule=None, lr=0.1, batch_size=3, seed=5):
    K, n = idx.shape
    return trainer.train(w0, X, Y, idx, torch.full((K,), n), steps, rule or StepRule(), lr, batch_size,
                         torch.Generator().manual_seed(seed))


def test_recorded_step_is_bit_identical_to_eager_and_is_replayed():
    torch.manual_seed(0)
    net = MLP(in_features=6, hidden=(5,), num_classes=3).double()
    X, Y = _data(40, (6,), 3)
    idx = _index(4, 9, 40)
    steps = torch.full((4,), 6)  # 9 examples in batches of 3: two epochs
    traced, eager = CohortTrainer(net, backend="vmap", chunk_size=4), CohortTrainer(net, backend="vmap", chunk_size=4, trace=False)
    w0 = traced.layout.module_vector(net)
    calls = []
    original = traced._vmapped
    traced._vmapped = lambda *a: (calls.append(1), original(*a))[1]
    a, b = _run(traced, w0, X, Y, idx, steps), _run(eager, w0, X, Y, idx, steps)
    assert torch.equal(a.weights, b.weights) and torch.equal(a.loss, b.loss)
    # eager once (the reference), once while recording; the other 5 steps replay the graph
    assert len(calls) == 2 and len([v for v in traced._traced.values() if v is not None]) == 1
    calls.clear()
    c = _run(traced, w0, X, Y, idx, steps)
    assert torch.equal(c.weights, a.weights) and calls == []  # a second round replays every step


def test_recorded_step_with_dropout_draws_what_eager_draws():
    """ReddiEMNISTCNN has dropout: under the same global seed the replay uses the same masks."""
    net = ReddiEMNISTCNN(num_classes=4).train()
    X, Y = _data(12, (1, 28, 28), 4, dtype=torch.float32)
    idx = _index(2, 6, 12)
    steps = torch.tensor([2, 2])
    results = []
    for trace in (True, False):
        tr = CohortTrainer(net, backend="vmap", trace=trace)
        w0 = tr.layout.module_vector(net)
        torch.manual_seed(11)
        results.append(_run(tr, w0, X, Y, idx, steps, lr=0.01, batch_size=3).weights)
        if trace:  # the step was recorded (the check against eager passed) and replayed
            assert [v is not None for v in tr._traced.values()] == [True]
    assert torch.equal(results[0], results[1])


def test_hooks_run_on_every_step():
    """A forward hook on the model still sees every step (hooked models are not replayed)."""
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    seen = []
    net.register_forward_hook(lambda *args: seen.append(1))
    X, Y = _data(12, (3,), 2)
    idx = _index(3, 4, 12)
    tr = CohortTrainer(net, backend="vmap")
    _run(tr, tr.layout.module_vector(net), X, Y, idx, torch.tensor([2, 2, 2]), batch_size=2)
    assert len(seen) == 2


def test_stragglers_in_any_order_with_a_per_client_rule():
    """Clients given in any order of steps done, with per-client scale/decay/shift, match the loop
    backend and the loop matches a hand-written per-client SGD."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    X, Y = _data(30, (4,), 3)
    idx = _index(5, 6, 30)
    steps = torch.tensor([1, 4, 0, 3, 4])
    P = sum(p.numel() for p in net.parameters())
    rule = StepRule(grad_scale=torch.tensor([1.0, 2.0, 1.5, 0.5, 1.0], dtype=torch.float64),
                    decay=torch.linspace(0.0, 0.1, P, dtype=torch.float64),
                    shift=torch.randn(5, P, dtype=torch.float64) * 1e-2)
    vm, lp = CohortTrainer(net, backend="vmap"), CohortTrainer(net, backend="loop")
    w0 = vm.layout.module_vector(net)
    a, b = _run(vm, w0, X, Y, idx, steps, rule), _run(lp, w0, X, Y, idx, steps, rule)
    assert (a.weights - b.weights).abs().max() < 1e-12 and (a.loss - b.loss).abs().max() < 1e-12
    assert torch.equal(a.weights[2], w0)  # inactive: untouched
    # client 3 by hand: w <- w - lr (scale g + decay w + shift) on the schedule's batches
    from lfed.engine import batch_schedule

    pos, valid = batch_schedule(torch.full((5,), 6), 4, 3, torch.Generator().manual_seed(5))
    w = w0.clone()
    for t in range(3):
        ex = idx[3, pos[3, t][valid[3, t]]]
        leaf = w.clone().requires_grad_(True)
        out = torch.func.functional_call(net, lp.layout.unflatten(leaf), (X[ex],))
        (g,) = torch.autograd.grad(nn.functional.cross_entropy(out, Y[ex]), leaf)
        w = w - 0.1 * (0.5 * g + rule.decay * w + rule.shift[3])
    assert (b.weights[3] - w).abs().max() < 1e-14
    # the model the trainer was given is left as it was
    assert torch.equal(vm.layout.module_vector(net), w0)


@pytest.mark.bitlevel
def test_cpu_chunks_hold_16_mb_of_weights_and_with_one_thread_change_nothing(one_thread):
    net = MLP(in_features=30, hidden=(40,), num_classes=5).double()
    tr = CohortTrainer(net, backend="vmap")
    P = tr.layout.num_params  # 30*40 + 40 + 40*5 + 5 = 1,445
    assert P == 1445
    assert tr._auto_chunk(100_000, "vmap", torch.device("cpu")) == (1 << 22) // 1445 == 2902
    assert tr._auto_chunk(7, "vmap", torch.device("cpu")) == 7
    assert tr._auto_chunk(5000, "loop", torch.device("cpu")) == 5000
    X, Y = _data(60, (30,), 5)
    idx = _index(6, 10, 60)
    w0 = tr.layout.module_vector(net)
    steps = torch.tensor([4, 2, 4, 3, 1, 4])
    whole = _run(CohortTrainer(net, backend="vmap", chunk_size=6), w0, X, Y, idx, steps, batch_size=4)
    for size in (1, 4):
        part = _run(CohortTrainer(net, backend="vmap", chunk_size=size), w0, X, Y, idx, steps, batch_size=4)
        assert torch.equal(part.weights, whole.weights) and torch.equal(part.loss, whole.loss)


class _WideFrozen(nn.Module):
    """Large activations, tiny P: a trainable 6 -> 4 stem under a wide frozen body (as adapters in the
    first layer of a frozen base: the body's activations are saved for the stem's gradient)."""

    def __init__(self, width=512):
        super().__init__()
        self.stem = nn.Linear(6, 4)
        self.body = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 3))
        for p in self.body.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        return self.body(self.stem(x))


def _schedule_args(K, n, B):
    pos = torch.arange(B).expand(K, 1, B)
    return torch.arange(K * n).view(K, n), pos, torch.ones(K, 1, B, dtype=torch.bool)


def test_saved_bytes_are_one_clients_activations_not_the_frozen_base():
    """What autograd saves for one client's step grows with the batch; the frozen base's weights
    (2 MB here) and the client's weights are not counted; the measurement is made once per shape."""
    torch.manual_seed(0)
    net = _WideFrozen().double()
    tr = CohortTrainer(net, backend="vmap")
    w0 = tr.layout.module_vector(net)
    X, Y = _data(64, (6,), 3)
    got = {}
    for B in (4, 8, 16):
        idx, pos, valid = _schedule_args(4, 16, B)
        got[B] = tr._saved_bytes(w0, X, Y, idx, pos, valid, 0)
    width_bytes = 512 * 8  # one example's activation of one wide layer, float64
    assert 2 * 4 * width_bytes <= got[4] < 8 * 4 * width_bytes  # a few [B, 512] tensors, not the 2 MB base
    assert got[16] - got[8] == 2 * (got[8] - got[4]) > 0  # linear in B
    calls = []
    original = tr._client_loss
    tr._client_loss = lambda *a: (calls.append(1), original(*a))[1]
    idx, pos, valid = _schedule_args(4, 16, 8)
    assert tr._saved_bytes(w0, X, Y, idx, pos, valid, 2) == got[8] and calls == []  # cached by shape


def _wide_cohort():
    """8 clients of :class:`_WideFrozen` (float64) with uneven steps, one inactive."""
    torch.manual_seed(1)
    net = _WideFrozen().double()
    X, Y = _data(80, (6,), 3)
    idx = _index(8, 10, 80)
    return net, X, Y, idx, torch.tensor([3, 1, 3, 2, 3, 0, 3, 2])


def _chunk_sizes(trainer):
    """Record the chunk sizes ``trainer`` trains (its ``_train_vmap`` calls) into the returned list."""
    sizes = []
    original = trainer._train_vmap
    trainer._train_vmap = lambda w, x, *a: (sizes.append(a[1].shape[0]), original(w, x, *a))[1]
    return sizes


def test_chunks_bound_activations_and_agree_to_the_tolerance():
    """A net with large activations and tiny P gets chunks smaller than K from its activations alone
    (the [chunk, P] rule allows thousands); the result is the unchunked one to the contract's tolerance
    (with two threads MKL splits the GEMMs of a chunk of 3 and one of 8 differently), and to it the loop's."""
    net, X, Y, idx, steps = _wide_cohort()
    tr = CohortTrainer(net, backend="vmap")
    P = tr.layout.num_params
    assert P == 6 * 4 + 4 and (1 << 22) // P > 2000
    w0 = tr.layout.module_vector(net)
    one = tr._saved_bytes(w0, X, Y, idx, *_schedule_args(8, 10, 4)[1:], 0)
    tr.activation_budget = lambda device: 3 * one + 1  # room for 3 clients' activations
    assert tr._auto_chunk(8, "vmap", torch.device("cpu"), one) == 3
    assert tr._auto_chunk(8, "vmap", torch.device("cpu")) == 8  # unmeasured: the [chunk, P] rule alone
    assert tr._auto_chunk(8, "loop", torch.device("cpu"), one) == 8
    sizes = _chunk_sizes(tr)
    got = _run(tr, w0, X, Y, idx, steps, batch_size=4)
    assert sizes == [3, 3, 2]
    whole = _run(CohortTrainer(net, backend="vmap", chunk_size=8), w0, X, Y, idx, steps, batch_size=4)
    assert_within(got.weights, whole.weights, what="chunks of 3 against one of 8")
    assert_within(got.loss, whole.loss, what="their losses")
    loop = _run(CohortTrainer(net, backend="loop"), w0, X, Y, idx, steps, batch_size=4)
    assert_within(loop.weights, whole.weights, what="the loop against vmap")
    # the user's chunk_size wins over the budget
    fixed = CohortTrainer(net, backend="vmap", chunk_size=5)
    fixed.activation_budget = lambda device: 1
    sizes = _chunk_sizes(fixed)
    again = _run(fixed, w0, X, Y, idx, steps, batch_size=4)
    assert sizes == [5, 3]
    assert_within(again.weights, whole.weights, what="chunks of 5 against one of 8")


@pytest.mark.bitlevel
def test_with_one_thread_chunks_of_any_size_change_no_bit(one_thread):
    """The cohort above in chunks of 1, 3 (the activation budget's), 5 and 8 under one intra-op thread: bit for bit."""
    net, X, Y, idx, steps = _wide_cohort()
    w0 = CohortTrainer(net, backend="vmap").layout.module_vector(net)
    whole = _run(CohortTrainer(net, backend="vmap", chunk_size=8), w0, X, Y, idx, steps, batch_size=4)
    for size in (1, 3, 5):
        tr = CohortTrainer(net, backend="vmap", chunk_size=size)
        sizes = _chunk_sizes(tr)
        part = _run(tr, w0, X, Y, idx, steps, batch_size=4)
        assert max(sizes) == size and torch.equal(part.weights, whole.weights) and torch.equal(part.loss, whole.loss)


def test_default_budget_chunks_a_large_cohort_of_a_wide_net():
    """With the default budget: chunk = budget // one client's saved bytes (and at least 1)."""
    from lfed.engine.trainer import CPU_ACTIVATION_BUDGET

    net = _WideFrozen(width=64)
    tr = CohortTrainer(net, backend="vmap")
    assert tr.activation_budget(torch.device("cpu")) == CPU_ACTIVATION_BUDGET
    one = 40 * 2**20  # 40 MB a client (a transformer's step): 3 clients in 128 MB
    assert tr._auto_chunk(200, "vmap", torch.device("cpu"), one) == CPU_ACTIVATION_BUDGET // one == 3
    assert tr._auto_chunk(200, "vmap", torch.device("cpu"), 10 * CPU_ACTIVATION_BUDGET) == 1


def test_the_measurement_leaves_no_trace():
    """No hook fires, no random number is drawn (dropout), and the hooks still fire afterwards."""
    net = nn.Sequential(nn.Linear(4, 32), nn.Dropout(0.5), nn.Tanh(), nn.Linear(32, 2)).double()
    seen = []
    net[0].register_forward_hook(lambda *a: seen.append("module"))
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: seen.append("global"))
    try:
        tr = CohortTrainer(net, backend="vmap")
        X, Y = _data(12, (4,), 2)
        w0 = tr.layout.module_vector(net)
        state = torch.get_rng_state()
        assert tr._saved_bytes(w0, X, Y, *_schedule_args(3, 4, 4), 0) > 0
        assert seen == [] and torch.equal(torch.get_rng_state(), state)
        net(X[:1])
        assert seen.count("module") == 1 and seen.count("global") >= 1
    finally:
        handle.remove()
