"""``round/amplification``: the round's step against FedAvg's step from the same gradients (lfed.core.round.server_update)."""

from __future__ import annotations

import pytest
import torch
from conftest import run_rounds
from lightning.pytorch import Callback
from torch import nn

from lfed.engine import StepRule
from lfed.evaluation.amplification import gradient_displacement
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule


def test_gradient_displacement_undoes_the_shift_and_scale_by_hand():
    # client 0: gamma = 2, shift (1, 0), 3 steps, lr 0.5: update = -0.5*2*G - 0.5*3*(1, 0)
    G = torch.tensor([[1.0, -2.0], [0.5, 0.25]], dtype=torch.float64)
    gamma = torch.tensor([2.0, 1.5], dtype=torch.float64)
    shift = torch.tensor([[1.0, 0.0], [0.0, -4.0]], dtype=torch.float64)
    steps = torch.tensor([3, 2])
    lr = 0.5
    updates = -lr * gamma[:, None] * G - lr * steps[:, None].double() * shift
    got = gradient_displacement(updates, StepRule(grad_scale=gamma, shift=shift), lr, steps)
    torch.testing.assert_close(got, -lr * G, rtol=0, atol=1e-15)
    assert gradient_displacement(updates, StepRule(decay=0.1), lr, steps) is None  # FedProx: not defined


class Amplification(Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.values.append(float(trainer.callback_metrics["round/amplification"]))


def _run(**kwargs):
    torch.manual_seed(0)
    m = FederatedModule(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), training=dict(client_lr=0.05, local_steps=3), **kwargs)
    spy = Amplification()
    run_rounds(m, FederatedDataModule(dataset="digits", num_clients=4, partition="iid"), 3, callbacks=[spy])
    return spy.values


def test_fedavg_amplification_is_one():
    assert _run(algorithm="fedavg", fraction=0.5) == pytest.approx([1.0, 1.0, 1.0], abs=1e-12)


def test_igfl_c_first_round_amplification_is_its_gradient_scale():
    # round 0: the history is zero, so IGFL-C is SGD at (1 + 1/|S|) eta_l (SPEC §2): Δ = (1 + 1/4) mean G
    values = _run(algorithm="igfl_c", fraction=1.0)
    assert values[0] == pytest.approx(1.25, abs=1e-12)
    assert values[1] != pytest.approx(1.25, abs=1e-3)  # the momentum of the history acts from round 1
