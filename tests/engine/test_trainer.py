"""CohortTrainer: both backends, the batch schedule, masking, and the step rule."""

import pytest
import torch
from torch import nn

from lfed.client.fisher import fisher_diagonal
from lfed.engine import CohortTrainer, StepRule, batch_schedule
from lfed.models.zoo import MLP, McMahanMNISTCNN


def _clients(sizes, total):
    idx = torch.zeros(len(sizes), max(sizes), dtype=torch.long)
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(3))
    off = 0
    for k, n in enumerate(sizes):
        idx[k, :n] = perm[off : off + n]
        off += n
    return idx, torch.tensor(sizes)


def _train(net, backend, X, Y, idx, sizes, steps, rule, lr=0.1, batch_size=4):
    trainer = CohortTrainer(net, backend=backend)
    w0 = trainer.layout.module_vector(net)
    return w0, trainer.train(w0, X, Y, idx, sizes, steps, rule, lr, batch_size, torch.Generator().manual_seed(7))


@pytest.mark.parametrize(
    "make_net,shape",
    [(lambda: MLP(in_features=784, hidden=(32, 16)), (1, 28, 28)), (lambda: McMahanMNISTCNN(), (1, 28, 28))],
    ids=["mlp", "mcmahan-cnn"],
)
def test_backends_agree_in_float64_with_uneven_clients(make_net, shape):
    torch.manual_seed(0)
    net = make_net().double()
    X = torch.randn(40, *shape, dtype=torch.float64)
    Y = torch.randint(0, 10, (40,))
    idx, sizes = _clients([11, 3, 7], 40)  # uneven; 11 and 7 end in a partial batch of B = 4
    steps = torch.tensor([4, 2, 3])  # more steps than one epoch for the small client
    P = sum(p.numel() for p in net.parameters())
    rule = StepRule(grad_scale=torch.tensor([1.0, 1.5, 1.0], dtype=torch.float64), decay=0.01,
                    shift=torch.full((3, P), 1e-3, dtype=torch.float64))
    _, a = _train(net, "vmap", X, Y, idx, sizes, steps, rule)
    _, b = _train(net, "loop", X, Y, idx, sizes, steps, rule)
    assert (a.weights - b.weights).abs().max() < 1e-10
    assert (a.loss - b.loss).abs().max() < 1e-10
    # and the clients really moved
    assert (a.weights[0] - a.weights[1]).abs().max() > 1e-4


@pytest.mark.parametrize("rule", [StepRule(), StepRule(grad_scale=1.5, decay=0.01)], ids=["plain", "corrected"])
def test_backends_agree_past_the_loop_backends_gather_of_32_steps(rule):
    # the loop backend gathers 32 steps' batches at once (lfed.engine.loop._LOOP_GATHER_STEPS): budgets of 0, 1, 31,
    # 32, 33 and 70 steps cross that boundary, with a partial batch every 3rd step (n = 5, B = 2)
    torch.manual_seed(0)
    net = MLP(in_features=6, hidden=(5,), num_classes=3).double()
    X, Y = torch.randn(30, 6, dtype=torch.float64), torch.randint(0, 3, (30,))
    idx, sizes = _clients([5] * 6, 30)
    steps = torch.tensor([0, 1, 31, 32, 33, 70])
    w0, a = _train(net, "vmap", X, Y, idx, sizes, steps, rule, lr=0.05, batch_size=2)
    _, b = _train(net, "loop", X, Y, idx, sizes, steps, rule, lr=0.05, batch_size=2)
    assert (a.weights - b.weights).abs().max() < 1e-12
    assert (a.loss - b.loss).abs().max() < 1e-12
    assert torch.equal(b.weights[0], w0) and (b.weights[5] - b.weights[4]).abs().max() > 1e-6


def test_batch_schedule_covers_each_epoch_once_and_masks_partial_batches():
    sizes = torch.tensor([5, 2])
    pos, valid = batch_schedule(sizes, num_steps=6, batch_size=2, generator=torch.Generator().manual_seed(0))
    assert pos.shape == (2, 6, 2)
    # client 0: 3 batches per epoch (2, 2, 1 examples); epochs at steps 0-2 and 3-5
    for epoch in range(2):
        got = pos[0, 3 * epoch : 3 * epoch + 3][valid[0, 3 * epoch : 3 * epoch + 3]]
        assert sorted(got.tolist()) == [0, 1, 2, 3, 4]
    assert valid[0, 2].tolist() == [True, False]
    # client 1: one full batch per epoch
    assert valid[1].all() and all(sorted(pos[1, t].tolist()) == [0, 1] for t in range(6))
    # full batch
    pos, valid = batch_schedule(sizes, num_steps=1, batch_size=None, generator=torch.Generator().manual_seed(0))
    assert valid.sum(-1)[:, 0].tolist() == [5, 2]


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_stragglers_stop_after_their_steps(backend):
    torch.manual_seed(1)
    net = nn.Linear(3, 2).double()
    X, Y = torch.randn(12, 3, dtype=torch.float64), torch.randint(0, 2, (12,))
    idx, sizes = _clients([4, 4, 4], 12)
    w0, full = _train(net, backend, X, Y, idx, sizes, torch.tensor([3, 3, 3]), StepRule())
    _, partial = _train(net, backend, X, Y, idx, sizes, torch.tensor([3, 0, 2]), StepRule())
    assert torch.equal(partial.weights[1], w0)  # inactive: unchanged
    assert torch.allclose(partial.weights[0], full.weights[0], atol=1e-14, rtol=0)
    # client 2 with 2 steps equals a hand-run of the same two batches
    pos, valid = batch_schedule(sizes, 3, 4, torch.Generator().manual_seed(7))
    w = w0.clone()
    trainer = CohortTrainer(net, backend="loop")
    for t in range(2):
        ex = idx[2, pos[2, t]]
        leaf = w.clone().requires_grad_(True)
        out = torch.func.functional_call(net, trainer.layout.unflatten(leaf), (X[ex],))
        (g,) = torch.autograd.grad(nn.functional.cross_entropy(out, Y[ex]), leaf)
        w = w - 0.1 * g
    assert torch.allclose(partial.weights[2], w, atol=1e-14, rtol=0)


def test_step_rule_is_the_linear_correction():
    g = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    w = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    rule = StepRule(grad_scale=torch.tensor([2.0, 1.0]), decay=torch.tensor([0.5, 0.0]), shift=torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
    # client 0: 2*[1,2] + [0.5,0]*[1,1] + [1,0] = [3.5, 4]; client 1: [3,4] + [1,0] + [0,-1] = [4, 3]
    assert torch.equal(rule.direction(g, w), torch.tensor([[3.5, 4.0], [4.0, 3.0]]))
    sub = rule.select(torch.tensor([1]), 2)
    assert torch.equal(sub.direction(g[1:], w[1:]), torch.tensor([[4.0, 3.0]]))
    # training's in-place step runs the same rule: w ← w - lr * direction
    from lfed.engine import _apply_step_

    stepped, fresh = w.clone(), g.clone()
    _apply_step_(stepped, fresh, rule, 0.5)
    assert torch.equal(stepped, w - 0.5 * torch.tensor([[3.5, 4.0], [4.0, 3.0]]))
    assert torch.equal(g, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))  # direction() leaves its input alone


class _BN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.out = nn.Linear(6, 2)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x))))


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_batchnorm_trains_on_both_backends_each_client_its_own_statistics(backend):
    # (0.4 refused BatchNorm on vmap; tests/engine/test_norm.py checks vmap against loop and by hand)
    net = _BN().double()
    X, Y = torch.randn(16, 4, dtype=torch.float64), torch.randint(0, 2, (16,))
    idx, sizes = _clients([8, 8], 16)
    auto = CohortTrainer(net, backend="auto")
    assert auto.resolve_backend(X, Y) == "vmap"
    w0, res = _train(net, backend, X, Y, idx, sizes, torch.tensor([2, 2]), StepRule())
    assert res.buffers is not None and res.buffers["bn.running_mean"].shape == (2, 6)
    assert not torch.equal(res.buffers["bn.running_mean"][0], res.buffers["bn.running_mean"][1])
    assert not torch.equal(res.weights[0], w0)


def test_fisher_diagonal_is_mean_of_squared_per_example_gradients():
    torch.manual_seed(2)
    net = nn.Linear(2, 2, bias=False).double()
    X, Y = torch.randn(6, 2, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1, 0])
    idx, sizes = torch.tensor([[0, 1, 2, 3, 4, 5]]), torch.tensor([6])
    for backend in ("vmap", "loop"):
        tr = CohortTrainer(net, backend=backend)
        w = tr.layout.module_vector(net)[None]
        F = fisher_diagonal(tr, w, X, Y, idx, sizes, num_samples=100, generator=torch.Generator().manual_seed(0))
        expected = torch.zeros(4, dtype=torch.float64)
        for i in range(6):
            net.zero_grad()
            nn.functional.cross_entropy(net(X[i : i + 1]), Y[i : i + 1]).backward()
            expected += net.weight.grad.flatten() ** 2
        assert torch.allclose(F[0], expected / 6, atol=1e-14)
        # not the squared batch gradient
        net.zero_grad()
        nn.functional.cross_entropy(net(X), Y).backward()
        assert not torch.allclose(F[0], net.weight.grad.flatten() ** 2)


def test_bad_arguments():
    with pytest.raises(ValueError, match="backend"):
        CohortTrainer(nn.Linear(2, 2), backend="jax")
    with pytest.raises(ValueError, match="chunk_size"):
        CohortTrainer(nn.Linear(2, 2), chunk_size=0)


def test_chunked_training_equals_unchunked():
    torch.manual_seed(4)
    net = nn.Linear(3, 2).double()
    X, Y = torch.randn(20, 3, dtype=torch.float64), torch.randint(0, 2, (20,))
    idx, sizes = _clients([5, 6, 4, 5], 20)
    rule = StepRule(shift=torch.randn(4, 8, dtype=torch.float64) * 0.01)
    steps = torch.tensor([2, 3, 1, 2])
    tr = CohortTrainer(net, backend="vmap")
    w0 = tr.layout.module_vector(net)
    a = tr.train(w0, X, Y, idx, sizes, steps, rule, 0.1, 2, torch.Generator().manual_seed(1))
    b = CohortTrainer(net, backend="vmap", chunk_size=3).train(w0, X, Y, idx, sizes, steps, rule, 0.1, 2, torch.Generator().manual_seed(1))
    assert torch.allclose(a.weights, b.weights, atol=1e-14, rtol=0)


def test_an_empty_cohort_trains_nothing_and_returns_no_rows():
    """Poisson sampling may draw nobody: the engine returns ``[0, P]`` weights and ``[0]`` losses (DP still adds noise)."""
    net = MLP(in_features=4, hidden=(3,), num_classes=2).double()
    tr = CohortTrainer(net)
    P = tr.layout.num_params
    res = tr.train(tr.layout.module_vector(net), torch.zeros(5, 4, dtype=torch.float64), torch.zeros(5, dtype=torch.long),
                   torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                   StepRule(), 0.1, 2, torch.Generator().manual_seed(0))
    assert res.weights.shape == (0, P) and res.loss.shape == (0,)
