"""Mixed precision (lfed.engine.precision): autocast in the local steps, float32 for the rest of a round.

Lightning's MixedPrecision plugin runs all of ``training_step`` (an lfed round) under autocast;
lfed keeps it to the clients' forward passes, so the aggregate and the server's state are float32.
"""

import pytest
import torch
from conftest import run_rounds
from torch import nn

import lfed.core.step
from lfed.engine import CohortTrainer, StepRule
from lfed.engine.precision import local_autocast, round_precision
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.models.zoo import MLP

BF16 = torch.bfloat16


def _mm_dtype():
    return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype


def test_a_round_switches_autocast_off_and_its_local_steps_on_again():
    assert _mm_dtype() == torch.float32
    with round_precision(), local_autocast():  # no autocast on: nothing changes
        assert _mm_dtype() == torch.float32
    with local_autocast():  # outside a round: nothing changes
        assert _mm_dtype() == torch.float32
    with torch.autocast("cpu", dtype=BF16):
        assert _mm_dtype() == BF16
        with local_autocast():  # outside a round the ambient autocast applies as it is
            assert _mm_dtype() == BF16
        with round_precision():
            assert _mm_dtype() == torch.float32 and not torch.is_autocast_enabled("cpu")
            with local_autocast():
                assert _mm_dtype() == BF16
            assert _mm_dtype() == torch.float32
        assert _mm_dtype() == BF16  # the ambient autocast is back after the round
    with local_autocast():
        assert _mm_dtype() == torch.float32


SEEN: list[torch.dtype] = []  # not an attribute of the net: the loop backend trains a copy of it


class Recorder(nn.Module):
    """A small MLP that records the dtype of its hidden activations on every forward (in ``SEEN``)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        SEEN.append(h.dtype)
        return self.fc2(h)


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_the_local_step_computes_in_bfloat16_and_returns_float32_weights(backend):
    torch.manual_seed(0)
    net = Recorder()
    gen = torch.Generator().manual_seed(1)
    X, Y = torch.randn(24, 6, generator=gen), torch.randint(0, 3, (24,), generator=gen)
    idx = torch.randperm(24, generator=gen).view(3, 8)
    trainer = CohortTrainer(net, backend=backend, trace=False)
    w0 = trainer.layout.module_vector(net)

    def train():
        SEEN.clear()
        return trainer.train(w0, X, Y, idx, torch.full((3,), 8), torch.full((3,), 4), StepRule(), 0.5, 4,
                             torch.Generator().manual_seed(2))

    full = train()
    assert set(SEEN) == {torch.float32}
    with torch.autocast("cpu", dtype=BF16), round_precision():
        mixed = train()
    assert set(SEEN) == {BF16}
    assert mixed.weights.dtype == torch.float32 and mixed.loss.dtype == torch.float32
    diff = (mixed.weights - full.weights).abs().max()
    assert 0 < diff < 0.05  # bfloat16 rounding (8 bits of mantissa) moved the weights, a little


def test_the_recorded_step_is_recorded_once_per_precision():
    torch.manual_seed(0)
    net = MLP(in_features=6, hidden=(8,), num_classes=3)
    gen = torch.Generator().manual_seed(1)
    X, Y = torch.randn(24, 6, generator=gen), torch.randint(0, 3, (24,), generator=gen)
    idx = torch.randperm(24, generator=gen).view(3, 8)

    def train(trainer):
        w0 = trainer.layout.module_vector(net)
        return trainer.train(w0, X, Y, idx, torch.full((3,), 8), torch.full((3,), 4), StepRule(), 0.5, 4,
                             torch.Generator().manual_seed(2)).weights

    recorded, eager = CohortTrainer(net, backend="vmap"), CohortTrainer(net, backend="vmap", trace=False)
    full = train(recorded)
    with torch.autocast("cpu", dtype=BF16), round_precision():
        mixed, mixed_eager = train(recorded), train(eager)
    assert torch.equal(mixed, mixed_eager) and not torch.equal(mixed, full)
    graphs = [g for g in recorded._traced.values() if g is not None]
    assert len(graphs) == 2  # one per precision, each checked bit for bit against the eager step
    casts = [sum(str(n.target) == "aten._to_copy.default" for n in g.graph.nodes) for g in graphs]
    assert casts[0] == 0 and casts[1] > 0
    assert torch.equal(train(recorded), full)  # float32 again: the float32 graph


class Elementwise(nn.Module):
    """Logits from elementwise products and sums only: nothing autocast would run in bfloat16."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(10, 6) * 0.1)
        self.b = nn.Parameter(torch.zeros(10))

    def forward(self, x):
        return (x.flatten(1)[:, :60].view(-1, 10, 6) * self.w).sum(-1) + self.b


@pytest.mark.parametrize("aggregation", ["mean", "self"])  # self: IGFL-S attention over the updates
def test_bf16_mixed_leaves_the_rest_of_the_round_in_float32(aggregation, monkeypatch):
    """With a net autocast has nothing to do in, bf16-mixed is 32-true bit for bit: no server arithmetic (the
    aggregate's weighted sum, attention's products, the server optimizer) ran in bfloat16."""
    outside = []
    finish = lfed.core.step.finish_step

    def spy(*args, **kwargs):
        outside.append((torch.is_autocast_enabled("cpu"), _mm_dtype()))
        return finish(*args, **kwargs)

    monkeypatch.setattr(lfed.core.step, "finish_step", spy)
    weights = {}
    for precision in ("32-true", "bf16-mixed"):
        torch.manual_seed(0)
        dm = FederatedDataModule(dataset="digits", num_clients=8, partition="iid")
        module = FederatedModule(Elementwise(), fraction=0.5, training=dict(client_lr=0.1, batch_size=10, local_steps=2),
                                 combination=aggregation, server_optimizer=lambda p: torch.optim.Adam(p, lr=0.01))
        run_rounds(module, dm, rounds=3, precision=precision)
        weights[precision] = module.layout.module_vector(module.net)
    assert weights["bf16-mixed"].dtype == torch.float32
    assert torch.equal(weights["bf16-mixed"], weights["32-true"])
    assert outside and set(outside) == {(False, torch.float32)}


def test_bf16_mixed_trains_the_digits():
    accuracy = {}
    for precision in ("bf16-mixed", "32-true"):
        torch.manual_seed(0)
        dm = FederatedDataModule(dataset="digits", num_clients=20, partition="iid")
        net = MLP(in_features=64, hidden=(200, 200), num_classes=10)
        module = FederatedModule(net, fraction=0.25, training=dict(client_lr=0.2, batch_size=10, local_epochs=2))
        seen = []
        net.register_forward_hook(lambda m, i, out, seen=seen: seen.append(out.dtype) if torch.is_grad_enabled() else None)
        trainer = run_rounds(module, dm, rounds=20, precision=precision, evaluate_every=20)
        assert (BF16 in seen) == (precision == "bf16-mixed")  # the local steps' outputs (the hook makes them eager)
        assert all(p.dtype == torch.float32 for p in module.net.parameters())
        accuracy[precision] = float(trainer.callback_metrics["test/acc"])
    assert accuracy["bf16-mixed"] > 0.85  # chance: 0.1
    assert abs(accuracy["bf16-mixed"] - accuracy["32-true"]) < 0.03


def test_16_mixed_on_the_cpu_is_lightnings_bf16_mixed():
    """Lightning runs 16-mixed on a CPU as bf16-mixed (it warns): float16 autocast is a GPU's (lfed.engine.precision)."""
    torch.manual_seed(0)
    dm = FederatedDataModule(dataset="digits", num_clients=8, partition="iid")
    net = MLP(in_features=64, hidden=(32,), num_classes=10)
    seen = []
    net.register_forward_hook(lambda m, i, out: seen.append(out.dtype) if torch.is_grad_enabled() else None)
    module = FederatedModule(net, fraction=0.5, training=dict(client_lr=0.2, batch_size=10, local_steps=3))
    with pytest.warns(UserWarning, match="fp16 is not supported on CPU"):
        trainer = run_rounds(module, dm, rounds=3, precision="16-mixed")
    assert trainer.precision == "bf16-mixed" and BF16 in seen and torch.float16 not in seen
    assert module.layout.module_vector(module.net).dtype == torch.float32


def test_the_float32_matmul_precision_is_the_users(monkeypatch):
    """lfed sets no float32 matmul precision: the one the user set holds in the local steps and the round."""
    inside, outside = [], []

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            inside.append(torch.get_float32_matmul_precision())
            return self.fc(x.flatten(1))

    finish = lfed.core.step.finish_step

    def spy(*args, **kwargs):
        outside.append(torch.get_float32_matmul_precision())
        return finish(*args, **kwargs)

    monkeypatch.setattr(lfed.core.step, "finish_step", spy)
    before = torch.get_float32_matmul_precision()
    try:
        for chosen in ("medium", "highest"):
            torch.set_float32_matmul_precision(chosen)
            inside.clear(), outside.clear()
            module = FederatedModule(Probe(), fraction=0.5, training=dict(client_lr=0.1, batch_size=10, local_steps=2))
            run_rounds(module, FederatedDataModule(dataset="digits", num_clients=4, partition="iid"), rounds=2,
                       precision="32-true")
            assert inside and outside and set(inside) == set(outside) == {chosen}
            assert torch.get_float32_matmul_precision() == chosen
    finally:
        torch.set_float32_matmul_precision(before)


def test_16_mixed_with_lightnings_loss_scaler_trains_and_says_the_scaler_is_not_used():
    """``16-mixed`` on a GPU comes with Lightning's GradScaler, whose first step failed in lfed's round ("Attempted
    unscale_ but _scale is None": the round has no loss for it): the CPU's GradScaler stands in for CUDA's."""
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.precision import MixedPrecision

    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.lightning.module import FederatedModule
    from lfed.models.zoo import MLP

    pl.seed_everything(0)
    module = FederatedModule(net=MLP(64, [32], 10), fraction=0.25)
    plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    trainer = pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, plugins=[plugin])
    with pytest.warns(UserWarning, match="loss scaler is not used"):
        trainer.fit(module, datamodule=FederatedDataModule(dataset="digits", num_clients=20))
    assert module.rounds_done == 3 and plugin.scaler is None
    w = module.layout.module_vector(module.net)
    assert w.dtype == torch.float32 and bool(torch.isfinite(w).all())
