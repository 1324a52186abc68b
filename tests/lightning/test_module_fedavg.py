"""FederatedModule with FedAvg: exact maths against centralised gradient descent, reuse, bad input."""

import pytest
import torch
from conftest import flat_weights, run_rounds
from torch import nn
from torch.utils.data import TensorDataset

from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule


def _toy(n=30, d=5, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (n,), generator=g)
    return x, y


def test_fedavg_full_participation_one_full_batch_step_is_centralised_gd():
    """C = 1, one full-batch step, size weights, server SGD lr 1: w ← w - η ∇ mean-loss(pooled)."""
    x, y = _toy()
    torch.manual_seed(0)
    net = nn.Linear(5, 3)
    ref = nn.Linear(5, 3).double()
    ref.load_state_dict(net.state_dict())
    dm = FederatedDataModule.from_tensors(x, y, x[:6], y[:6], num_clients=4, partition="dirichlet", rho=1.0, holdout_fraction=0.0)
    module = FederatedModule(net, algorithm="fedavg", fraction=1.0, training=dict(client_lr=0.3, batch_size=None, local_steps=1))
    run_rounds(module, dm, rounds=3)
    sizes = dm.data.client_sizes
    assert len(set(sizes.tolist())) > 1 or True  # quotas may be equal; weights still n_k / n
    opt = torch.optim.SGD(ref.parameters(), lr=0.3)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        opt.step()
    expected = torch.cat([ref.weight.detach().flatten(), ref.bias.detach().flatten()])
    assert torch.allclose(flat_weights(module), expected, atol=1e-12, rtol=0)


def test_fedavg_uneven_clients_weighted_by_size():
    """Two clients of 2 and 6 examples, one full-batch step each: Δ = (2/8) Δ_1 + (6/8) Δ_2."""
    x, y = _toy(n=8)
    torch.manual_seed(1)
    net = nn.Linear(5, 3).double()
    w0 = torch.cat([net.weight.detach().flatten(), net.bias.detach().flatten()])
    dm = FederatedDataModule.from_tensors(x, y, x, y, num_clients=2, partition="iid", holdout_fraction=0.0)
    dm.build()
    # force uneven clients through the packed index
    dm.data.client_index = torch.tensor([[0, 1, 0, 0, 0, 0], [2, 3, 4, 5, 6, 7]])
    dm.data.client_sizes = torch.tensor([2, 6])
    module = FederatedModule(net, fraction=1.0, training=dict(client_lr=0.5, batch_size=None, local_steps=1))
    run_rounds(module, dm, rounds=1)
    deltas = []
    for rows in ([0, 1], [2, 3, 4, 5, 6, 7]):
        m = nn.Linear(5, 3).double()
        m.weight.data, m.bias.data = w0[:15].view(3, 5).clone(), w0[15:].clone()
        nn.functional.cross_entropy(m(x[rows]), y[rows]).backward()
        deltas.append(-0.5 * torch.cat([m.weight.grad.flatten(), m.bias.grad.flatten()]))
    expected = w0 + 0.25 * deltas[0] + 0.75 * deltas[1]
    assert torch.allclose(flat_weights(module), expected, atol=1e-14, rtol=0)


class UserNet(nn.Module):
    """A user's own model, loss and data, with no lfed internals."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))

    def forward(self, x):
        return self.body(x)


def test_users_own_module_loss_and_dataset_plug_in():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 4, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    train, test = TensorDataset(x[:300], y[:300]), TensorDataset(x[300:], y[300:])
    dm = FederatedDataModule(train=train, test=test, num_clients=10, partition="iid")
    module = FederatedModule(UserNet(), loss=nn.CrossEntropyLoss(label_smoothing=0.05), fraction=0.5,
                             training=dict(client_lr=0.5, batch_size=16))
    trainer = run_rounds(module, dm, rounds=20, evaluate_every=20, precision="32-true")
    assert trainer.callback_metrics["test/acc"] > 0.85
    assert 0 <= trainer.callback_metrics["client/acc_worst10pct"] <= trainer.callback_metrics["client/acc_mean"]


def test_global_step_counts_rounds():
    x, y = _toy(n=40)
    dm = FederatedDataModule.from_tensors(x, y, x, y, num_clients=4, partition="iid")
    module = FederatedModule(nn.Linear(5, 3), fraction=0.5)
    trainer = run_rounds(module, dm, rounds=7, precision="32-true")
    assert trainer.global_step == 7 and module.comm.rounds == 7 and module.comm.uploads == 14


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"fraction": 0.0}, "fraction"),
        ({"fraction": 1.5}, "fraction"),
        ({"training": {"client_lr": -1.0}}, "client_lr"),
        ({"training": {"batch_size": 0}}, "batch_size"),
        ({"engine": {"backend": "jit"}}, "backend"),
        ({"algorithm": "fedsgd"}, "algorithm"),
        ({"combination": "medoid"}, "combination"),  # not a name (median is one since 0.5: lfed.robust)
        ({"objective": "moon"}, "objective"),  # ditto is a name since 0.5 (lfed.core.registry.NAMES)
        ({"sampler": "greedy"}, "sampler"),
        ({"objective": {"class_path": "lfed.client.objectives.Prox", "init_args": {"mu": -0.1}}, "algorithm": "fedprox"}, "mu"),
        ({"combination": {"class_path": "lfed.server.combination.IGFLAttention", "init_args": {"temperature": 0.0}}}, "attention_temperature"),
        ({"channel": 0.0}, "q|sparsity|compression"),
    ],
)
def test_bad_module_arguments_fail_early(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FederatedModule(nn.Linear(2, 2), **kwargs)


def test_bad_data_arguments_fail_early():
    x, y = _toy(n=10)
    with pytest.raises(ValueError, match="dataset"):
        FederatedDataModule(dataset="imagenet")
    with pytest.raises(ValueError, match="num_clients"):
        FederatedDataModule.from_tensors(x, y, x, y, num_clients=11, partition="iid").build()
    with pytest.raises(ValueError, match="rho"):
        FederatedDataModule.from_tensors(x, y, x, y, num_clients=2, partition="dirichlet", rho=0.0).build()
    with pytest.raises(ValueError, match="label"):
        FederatedDataModule.from_tensors(x, y, x, torch.full_like(y, 7), num_clients=2, num_classes=3).build()
