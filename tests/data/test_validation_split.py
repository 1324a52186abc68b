"""The server's validation split (SPEC §9): set aside before partitioning, evaluated beside the test set."""

from __future__ import annotations

import pytest
import torch
from conftest import run_rounds
from lightning.pytorch import Callback
from torch import nn

from lfed.data.partition import validation_split
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule


def test_validation_split_sizes_disjoint_and_seeded():
    rest, val = validation_split(10, 0.25, seed=3)
    assert val.numel() == 3  # floor(2.5 + 0.5) = 3: rounded half up
    assert rest.numel() == 7
    assert sorted(torch.cat([rest, val]).tolist()) == list(range(10))
    again_rest, again_val = validation_split(10, 0.25, seed=3)
    assert torch.equal(val, again_val) and torch.equal(rest, again_rest)
    none_rest, none_val = validation_split(5, 0.0)
    assert none_val.numel() == 0 and none_rest.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("bad", [-0.1, 1.0, True])
def test_validation_fraction_out_of_range_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="validation_fraction"):
        FederatedDataModule(dataset="digits", validation_fraction=bad)
    with pytest.raises(ValueError, match="validation_fraction"):
        validation_split(10, bad)


def test_a_share_that_rounds_to_no_example_is_refused():
    with pytest.raises(ValueError, match="validation_fraction.*rounds to none"):
        validation_split(4, 0.1)


def test_no_client_holds_a_validation_example_and_nothing_is_lost():
    dm = FederatedDataModule(dataset="digits", num_clients=6, partition="dirichlet", validation_fraction=0.1, seed=2)
    d = dm.build()
    n = d.train_y.numel()
    assert d.has_validation and d.val_index.numel() == int(n * 0.1 + 0.5)
    held = [d.client_index[k, : d.client_sizes[k]] for k in range(6)]
    held += [d.holdout_index[k, : d.holdout_sizes[k]] for k in range(6)]
    clients = torch.cat(held)
    assert set(clients.tolist()).isdisjoint(d.val_index.tolist())
    assert sorted(torch.cat([clients, d.val_index]).tolist()) == list(range(n))
    # without a validation share nothing changes: the same split as before the option existed
    plain = FederatedDataModule(dataset="digits", num_clients=6, partition="dirichlet", seed=2).build()
    assert not plain.has_validation and plain.client_sizes.sum() + plain.holdout_sizes.sum() == n


def test_val_and_test_accuracy_are_each_their_own_set_by_hand():
    torch.manual_seed(0)
    m = FederatedModule(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), training=dict(client_lr=0.1, local_steps=2), fraction=0.5)
    dm = FederatedDataModule(dataset="digits", num_clients=6, partition="iid", validation_fraction=0.2)
    seen = []

    class Spy(Callback):
        def on_validation_end(self, trainer, pl_module):  # after the module's epoch-end logging
            d = pl_module.runs[0].data
            with torch.no_grad():
                def acc(x, y):
                    return float((pl_module.net(x.to(torch.float64)).argmax(-1) == y).double().mean())
                seen.append((acc(d.train_x[d.val_index], d.train_y[d.val_index]), acc(d.test_x, d.test_y),
                             float(trainer.callback_metrics["val/acc"]), float(trainer.callback_metrics["test/acc"])))

    run_rounds(m, dm, 4, evaluate_every=2, callbacks=[Spy()])
    assert len(seen) == 2
    for val_by_hand, test_by_hand, val_logged, test_logged in seen:  # logged metrics are float32
        assert val_logged == pytest.approx(val_by_hand, abs=1e-6)
        assert test_logged == pytest.approx(test_by_hand, abs=1e-6)
    assert seen[0][0] != pytest.approx(seen[0][1], abs=1e-6)  # two different sets
    assert [a for _, a in m.val_history] == pytest.approx([s[0] for s in seen], abs=1e-12)
    assert [a for _, a in m.eval_history] == pytest.approx([s[1] for s in seen], abs=1e-12)
    # the last 10% of 4 rounds is the last evaluation
    assert m.final_summary["final/val_acc_last10pct"] == pytest.approx(seen[-1][0])
    assert m.final_summary["final/test_acc_last10pct"] == pytest.approx(seen[-1][1])
