"""A frozen base (parameters with ``requires_grad=False``) end to end, for any model (SPEC §12).

Only the trainable parameters are client weights: ``P`` counts them alone, the engine stacks and
steps them alone (both backends), the channel uploads and counts bits for them alone, client
state rows are ``P`` long; the frozen parameters are the net's own tensors, never stacked or
copied, bit-identical after any rounds, once in a checkpoint, and a resume checks them.

The strongest check: a net whose first layer is frozen trains exactly as the same net with that
layer held as *buffers* (constants the engine passes but never trains): same ``P``, same weights
after the rounds, same bits. If the engine stacked, stepped or uploaded a frozen parameter, the
two would differ.
"""

from __future__ import annotations

import pytest
import torch
from conftest import run_rounds
from test_checkpoint import assert_same_state, fit, load, run_state, write_config
from torch import nn

from lfed.engine.params import ParamLayout
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule

BACKENDS = ["vmap", "loop"]


class HalfFrozenMLP(nn.Module):
    """64-16-10 MLP whose first layer is frozen (a tiny "pretrained base" under a trainable head).

    Trainable: ``fc2`` (16*10 + 10 = 170 parameters); frozen: ``fc1`` (64*16 + 16 = 1,040).
    ``base_seed`` draws the frozen layer (the base) from its own generator.
    """

    def __init__(self, in_features: int = 64, hidden: int = 16, num_classes: int = 10, base_seed: int = 7) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        g = torch.Generator().manual_seed(base_seed)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.randn(hidden, in_features, generator=g) / in_features**0.5)
            self.fc1.bias.copy_(0.1 * torch.randn(hidden, generator=g))
        self.fc1.requires_grad_(False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class BufferBaseMLP(nn.Module):
    """The same function with the first layer as buffers: constants by construction."""

    def __init__(self, like: HalfFrozenMLP) -> None:
        super().__init__()
        self.register_buffer("w1", like.fc1.weight.detach().clone())
        self.register_buffer("b1", like.fc1.bias.detach().clone())
        self.fc2 = nn.Linear(like.fc2.in_features, like.fc2.out_features)
        with torch.no_grad():
            self.fc2.weight.copy_(like.fc2.weight)
            self.fc2.bias.copy_(like.fc2.bias)

    def forward(self, x):
        return self.fc2(torch.relu(x.flatten(1) @ self.w1.T + self.b1))


def digits(num_clients: int = 10) -> FederatedDataModule:
    return FederatedDataModule(dataset="digits", num_clients=num_clients, partition="dirichlet", rho=0.5, seed=0)


def frozen_state(net: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in net.named_parameters() if not p.requires_grad}


def test_p_counts_the_trainable_parameters_only():
    net = HalfFrozenMLP()
    layout = ParamLayout.from_module(net)
    assert layout.names == ("fc2.weight", "fc2.bias")
    assert layout.num_params == 16 * 10 + 10 == 170
    assert sum(p.numel() for p in net.parameters()) == 170 + 64 * 16 + 16


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm, extra", [("scaffold", {}), ("scaffold", {"engine": {"client_state": "host"}}),
                                              ("efl", {"channel": 0.3, "objective": {"class_path": "lfed.client.objectives.EFL",
                                                                                     "init_args": {"fisher_samples": 8}}})],
                         ids=["scaffold", "scaffold-host-rows", "efl-compressed"])
def test_a_frozen_base_trains_as_constants_and_only_the_trainable_part_travels(backend, algorithm, extra):
    torch.manual_seed(0)
    net = HalfFrozenMLP().double()
    same_as_buffers = BufferBaseMLP(net)
    before, start = frozen_state(net), ParamLayout.from_module(net).module_vector(net)
    extra = dict(extra)
    engine = {"backend": backend, **extra.pop("engine", {})}
    kwargs = dict(algorithm=algorithm, engine=engine, fraction=0.3, training=dict(client_lr=0.05, batch_size=10, local_steps=3), **extra)
    module = FederatedModule(net=net, **kwargs)
    reference = FederatedModule(net=same_as_buffers, **kwargs)
    run_rounds(module, digits(), 3)
    run_rounds(reference, digits(), 3)

    P = 170
    assert module.layout.num_params == reference.layout.num_params == P
    # the frozen base: bit-identical, still the net's own tensors, never a stacked copy
    for name, p in net.named_parameters():
        if name in before:
            assert not p.requires_grad and torch.equal(p, before[name]), name
    # the trainable part trained exactly as the same net with the base held as constants
    assert not torch.equal(module.layout.module_vector(net), start)
    torch.testing.assert_close(module.layout.module_vector(net), reference.layout.module_vector(same_as_buffers), atol=1e-12, rtol=0)
    # what was uploaded and counted: P entries per upload
    rec = module.last_round
    assert rec.result.weights.shape == (rec.cohort.clients.numel(), P)
    assert rec.bits_up == rec.uploads * module.channel.bits([16 * 10, 10]) and rec.bits_up > 0
    if algorithm == "scaffold":
        assert rec.bits_up == rec.uploads * 32 * P  # dense: 32 bits per trainable entry
    assert module.comm.state_dict() == reference.comm.state_dict()
    # every per-client row and every server tensor of the declared state is P long
    described = module.store.describe()
    assert described and all(shape[-1] == P for shape in described.values()), described


def test_the_loop_backend_shares_the_frozen_base_instead_of_copying_it():
    net = HalfFrozenMLP().double()
    module = FederatedModule(net=net, engine=dict(backend="loop"), fraction=0.3, training=dict(local_steps=2))
    run_rounds(module, digits(), 1)
    work = module.engine._work
    assert work is not None
    assert work.fc1.weight is net.fc1.weight and work.fc1.bias is net.fc1.bias  # one base on the device
    assert work.fc2.weight is not net.fc2.weight  # the trainable part is the work copy's own
    with torch.no_grad():  # a base loaded into the net later is the one the loop backend computes with
        net.fc1.weight.mul_(2.0)
    assert torch.equal(work.fc1.weight, net.fc1.weight)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_with_a_frozen_base_is_bit_identical_and_the_checkpoint_holds_the_base_once(tmp_path, backend):
    keep_all = {"callbacks": [{"class_path": "lfed.lightning.checkpoint.RoundCheckpoint",
                               "init_args": {"dirpath": str(tmp_path / "ckpts"), "every_n_train_steps": 3, "save_top_k": -1}}]}
    config = write_config(tmp_path / "cfg.yaml", "scaffold", trainer=keep_all, engine={"backend": backend},
                          net={"class_path": "test_frozen_base.HalfFrozenMLP"})
    straight = fit(config)
    base = HalfFrozenMLP()
    for name in ("fc1.weight", "fc1.bias"):  # not trained: the base as built, after 6 rounds
        assert torch.equal(straight.model.net.get_parameter(name).float(), getattr(base.fc1, name[4:]))
    want = run_state(straight)
    middle = tmp_path / "ckpts" / "epoch=0-step=3.ckpt"
    ckpt = load(middle)
    state = ckpt["state_dict"]
    assert [k for k in state if k.startswith("net.")] == ["net.fc1.weight", "net.fc1.bias", "net.fc2.weight", "net.fc2.bias"]
    assert state["net.fc1.weight"].shape == (16, 64)  # the base, once
    assert all(v.shape[-1] == 170 for k, v in state.items() if k.startswith("objective.") and k.endswith(".rows"))
    fp = ckpt["lfed"]["runs"][0]["fingerprint"]
    assert fp["model.frozen"] == ["fc1.weight[16, 64]", "fc1.bias[16]"] and fp["model.num_params"] == 170
    got = run_state(fit(config, "--ckpt_path", str(middle)))
    assert_same_state(got, want)


def test_a_checkpoint_over_another_frozen_base_is_refused(tmp_path):
    config = write_config(tmp_path / "cfg.yaml", "fedavg", rounds=2, every=1, net={"class_path": "test_frozen_base.HalfFrozenMLP"})
    fit(config)
    [last] = (tmp_path / "run").glob("runs/*/version_*/checkpoints/last.ckpt")
    other = write_config(tmp_path / "other.yaml", "fedavg", rounds=2, every=1,
                         net={"class_path": "test_frozen_base.HalfFrozenMLP", "init_args": {"base_seed": 8}})
    with pytest.raises(ValueError, match=r"model\.frozen_digest: checkpoint '[0-9a-f]{16}', this run '[0-9a-f]{16}'"):
        fit(other, "--ckpt_path", str(last))
