"""BatchNorm inside the vmapped cohort (lfed.engine.norm): each client's running statistics its own row, batch
statistics over its valid examples only; by hand, and against the loop backend (torch's own BatchNorm) in float64."""

import pytest
import torch
from test_trainer import _clients
from torch import nn

from lfed.engine import CohortTrainer, StepRule

BACKENDS = ("vmap", "loop")


def _train(net, backend, X, Y, idx, sizes, steps, lr=0.1, batch_size=4, **kwargs):
    trainer = CohortTrainer(net, backend=backend, chunk_size=kwargs.pop("chunk_size", None), trace=kwargs.pop("trace", True))
    w0 = trainer.layout.module_vector(net)
    return trainer.train(w0, X, Y, idx, sizes, steps, StepRule(), lr, batch_size, torch.Generator().manual_seed(7), **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "cumulative"])
def test_running_statistics_by_hand(backend, momentum):
    # the norm first, so its input is the data itself: two full-batch steps over each client's n_k examples
    # (a cohort of 5 and 3: the smaller client's batch is padded on the vmap backend) see the same batch twice
    torch.manual_seed(1)
    net = nn.Sequential(nn.BatchNorm1d(3, momentum=momentum), nn.Linear(3, 2)).double()
    X, Y = torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 2, (8,))
    idx, sizes = _clients([5, 3], 8)
    res = _train(net, backend, X, Y, idx, sizes, torch.tensor([2, 2]), batch_size=None)
    for k, n in enumerate([5, 3]):
        x = X[idx[k, :n]]
        mu, s2 = x.mean(0), x.var(0, unbiased=True)  # torch updates the running variance with the unbiased one
        if momentum is None:  # cumulative average: factors 1, then 1/2 of the same batch
            mean, var = mu, s2
        else:  # (1 - f)((1 - f) r + f b) + f b from r = 0 (mean) and r = 1 (variance), f = 0.1
            mean, var = 0.19 * mu, 0.81 + 0.19 * s2
        torch.testing.assert_close(res.buffers["0.running_mean"][k], mean, atol=1e-15, rtol=0)
        torch.testing.assert_close(res.buffers["0.running_var"][k], var, atol=1e-15, rtol=0)
        assert res.buffers["0.num_batches_tracked"][k].item() == 2


class _ConvBN(nn.Module):
    """A convolution with BatchNorm2d, then a linear layer with BatchNorm1d (each optionally without affine)."""

    def __init__(self, momentum=0.1, affine=True, track=True):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3)
        self.bn = nn.BatchNorm2d(3, momentum=momentum, affine=affine, track_running_stats=track)
        self.fc = nn.Linear(3 * 4 * 4, 5)
        self.bn1 = nn.BatchNorm1d(5, momentum=momentum, track_running_stats=track)
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        return self.out(torch.relu(self.bn1(self.fc(torch.relu(self.bn(self.conv(x))).flatten(1)))))


def _data():
    torch.manual_seed(0)
    X, Y = torch.randn(40, 1, 6, 6, dtype=torch.float64), torch.randint(0, 3, (40,))
    idx, sizes = _clients([11, 6, 7, 5], 40)  # 11, 6 and 7 end in a partial batch of B = 4 (3, 2 and 3 examples)
    return X, Y, idx, sizes


@pytest.mark.parametrize("net_args", [dict(), dict(momentum=None), dict(affine=False), dict(track=False)],
                         ids=["momentum", "cumulative", "no-affine", "untracked"])
def test_vmap_equals_loop_in_float64_weights_and_every_buffer(net_args):
    X, Y, idx, sizes = _data()
    steps = torch.tensor([4, 2, 3, 0])  # stragglers, and a client that does nothing
    torch.manual_seed(2)
    net = _ConvBN(**net_args).double()
    before = {k: v.clone() for k, v in net.named_buffers()}
    a = _train(net, "vmap", X, Y, idx, sizes, steps)
    b = _train(net, "loop", X, Y, idx, sizes, steps)
    assert (a.weights - b.weights).abs().max() < 1e-12 and (a.loss - b.loss).abs().max() < 1e-12
    assert all(torch.equal(before[k], v) for k, v in net.named_buffers())  # the net's own buffers stay as they were
    if not net_args.get("track", True):  # no running statistics: nothing per client comes back
        assert a.buffers is None and b.buffers is None
        return
    assert set(a.buffers) == set(b.buffers) == set(before)
    for name, value in b.buffers.items():
        assert a.buffers[name].shape == value.shape and a.buffers[name].dtype == value.dtype
        assert (a.buffers[name] - value).abs().max() < 1e-12, name
    assert a.buffers["bn.num_batches_tracked"].tolist() == [4, 2, 3, 0]  # each client's own steps
    assert torch.equal(a.buffers["bn.running_mean"][3], before["bn.running_mean"])  # no steps: the start statistics
    assert not torch.equal(a.buffers["bn.running_mean"][0], a.buffers["bn.running_mean"][1])


def test_each_rows_start_buffers_chunks_and_the_recorded_step(one_thread):  # chunks bit for bit: one thread (docs/reproducibility.md)
    X, Y, idx, sizes = _data()
    steps = torch.tensor([3, 3, 2, 1])
    torch.manual_seed(3)
    net = _ConvBN().double()
    own = dict(net.named_buffers())
    start = {"bn.running_mean": torch.randn(4, 3, dtype=torch.float64), "bn.running_var": torch.rand(4, 3, dtype=torch.float64) + 0.5,
             "bn.num_batches_tracked": torch.tensor([0, 5, 2, 9])}
    loop = _train(net, "loop", X, Y, idx, sizes, steps, buffers=start)
    whole = _train(net, "vmap", X, Y, idx, sizes, steps, buffers=start)
    eager = _train(net, "vmap", X, Y, idx, sizes, steps, buffers=start, trace=False)
    chunked = _train(net, "vmap", X, Y, idx, sizes, steps, buffers=start, chunk_size=1)
    for name in own:
        assert (whole.buffers[name] - loop.buffers[name]).abs().max() < 1e-12, name
        assert torch.equal(whole.buffers[name], eager.buffers[name])  # recorded = eager, bit for bit
        assert torch.equal(whole.buffers[name], chunked.buffers[name])  # chunking changes nothing
    assert torch.equal(whole.weights, eager.weights) and torch.equal(whole.weights, chunked.weights)
    assert (whole.weights - loop.weights).abs().max() < 1e-12
    assert whole.buffers["bn.num_batches_tracked"].tolist() == [3, 8, 4, 10]
    trainer = CohortTrainer(net, backend="vmap")  # the step was recorded (not only run eagerly)
    trainer.train(trainer.layout.module_vector(net), X, Y, idx, sizes, torch.tensor([1, 1, 1, 1]), StepRule(), 0.1, 4,
                  torch.Generator().manual_seed(7))
    assert any(fn is not None for fn in trainer._traced.values())


def test_auto_picks_vmap_for_a_batchnorm_net():
    X, Y, idx, sizes = _data()
    net = _ConvBN().double()
    assert CohortTrainer(net, backend="auto").resolve_backend(X, Y) == "vmap"


# ------------------------------------------------------------------ a batch of one at a BatchNorm without spatial extent (issue 62, item 12)


class _FlatBN(nn.Module):
    """A convolution to a 1x1 map with BatchNorm2d (no spatial extent), then BatchNorm1d over features."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)  # 3x3 -> 1x1
        self.bn = nn.BatchNorm2d(2)
        self.fc = nn.Linear(2, 3)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).flatten(1))


def test_a_batch_of_one_is_found_by_hand():
    from lfed.engine.norm import check_batches_of_one, flat_batch_norms

    mlp = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    x = torch.randn(2, 3)
    assert flat_batch_norms(mlp, x) == ["1"] and mlp.training and mlp[1].running_mean.abs().sum() == 0
    assert flat_batch_norms(_ConvBN(), torch.randn(2, 1, 6, 6)) == ["bn1"]  # the 4x4 maps' BatchNorm2d has extent
    assert flat_batch_norms(_FlatBN(), torch.randn(2, 1, 3, 3)) == ["bn"]  # a 1x1 map has none
    spatial = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(32, 2))
    assert flat_batch_norms(spatial, torch.randn(2, 1, 6, 6)) == []
    sizes = torch.tensor([8, 9, 6, 13])  # with B = 4: last batches of 4, 1, 2, 1
    with pytest.raises(ValueError, match=r"^batch_size: with batch_size 4 client 1's 9 examples leave a batch of one "
                                         r"\(1 more client\(s\) too\), and BatchNorm layer '1' has no spatial extent"):
        check_batches_of_one(mlp, x, sizes, 4)
    with pytest.raises(ValueError, match=r"with batch_size 5 client 2's 6 examples leave a batch of one, and"):
        check_batches_of_one(mlp, x, sizes, 5)  # last batches of 3, 4, 1, 3
    check_batches_of_one(spatial, torch.randn(2, 1, 6, 6), sizes, 4)  # spatial extent: a batch of one is fine
    check_batches_of_one(mlp, x, torch.tensor([8, 10, 6, 12]), 4)
    with pytest.raises(ValueError, match="with batch_size 1 client 0's 8 examples"):
        check_batches_of_one(mlp, x, sizes, 1)
    with pytest.raises(ValueError, match=r"with full batches \(batch_size None\) client 2's 1 examples"):
        check_batches_of_one(mlp, x, torch.tensor([8, 9, 1]), None)
    check_batches_of_one(mlp, x, sizes, None)
    check_batches_of_one(nn.Linear(3, 2), x, sizes, 4)  # no BatchNorm: nothing to refuse


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", [lambda: nn.Sequential(nn.Flatten(), nn.Linear(9, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)),
                                  _FlatBN], ids=["batchnorm1d", "batchnorm2d-1x1"])
def test_a_run_refuses_a_batch_of_one_before_round_0_on_both_backends(backend, make):
    """Clients of 5 and 4 examples with batch_size 4: the first one's last batch is one example. torch (the loop
    backend) raises mid-round and the vmap backend wrote running_var = NaN; both now refuse it in one line, before
    round 0, and batch_size 5 runs."""
    from lfed.core.algorithm import LocalTraining
    from lfed.core.fit import fit_run
    from lfed.core.settings import Engine, build_run
    from lfed.lightning.datamodule import FederatedDataModule

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(9, 1, 3, 3, generator=g), torch.arange(9) % 3

    def data():
        return FederatedDataModule.from_tensors(x, y, x, y, num_clients=2, partition="iid", holdout_fraction=0.0)

    assert data().build().client_sizes.tolist() == [5, 4]
    torch.manual_seed(0)
    run = build_run(net=make(), training=LocalTraining(client_lr=0.1, batch_size=4, local_epochs=1), fraction=1.0,
                    engine=Engine(backend=backend))
    with pytest.raises(ValueError, match=r"^batch_size: with batch_size 4 client 0's 5 examples leave a batch of one, "
                                         r"and BatchNorm layer '.*' has no spatial extent.*GroupNorm, LayerNorm\)$"):
        fit_run(run, data(), 1)
    assert run.rounds_done == 0
    torch.manual_seed(0)
    ok = build_run(net=make(), training=LocalTraining(client_lr=0.1, batch_size=5, local_epochs=1), fraction=1.0,
                   engine=Engine(backend=backend))
    fit_run(ok, data(), 1)
    assert all(torch.isfinite(b).all() for b in ok.net.buffers())


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_engine_itself_refuses_a_step_of_one_example_at_a_flat_batchnorm_on_both_backends(backend):
    """CohortTrainer.train called directly (no run, so no check before round 0): clients of 5 and 4 examples, B = 4,
    one epoch: client 0's second step has one example. torch's BatchNorm1d raises on the loop backend; the vmap
    backend wrote running_var = NaN (n/(n-1) with n = 1). The engine now refuses on both, naming the row and the step;
    with 2 steps of client 0 only its first (4 examples) is taken and both train; a net whose BatchNorm has spatial
    extent trains a batch of one."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double()
    X, Y = torch.randn(9, 3, dtype=torch.float64), torch.randint(0, 2, (9,))
    idx, sizes = _clients([5, 4], 9)
    with pytest.raises(ValueError, match=r"^batch_size: row 0's step 1 has a batch of one example, and BatchNorm layer "
                                         r"'1' has no spatial extent"):
        _train(net, backend, X, Y, idx, sizes, torch.tensor([2, 1]))
    res = _train(net, backend, X, Y, idx, sizes, torch.tensor([1, 1]))
    assert all(bool(torch.isfinite(b).all()) for b in res.buffers.values())
    conv = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 2)).double()
    Xc = torch.randn(9, 1, 4, 4, dtype=torch.float64)
    res = _train(conv, backend, Xc, Y, idx, sizes, torch.tensor([2, 1]))
    assert all(bool(torch.isfinite(b).all()) for b in res.buffers.values())
