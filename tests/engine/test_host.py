"""No host synchronization inside a round (issue 37): the round reads host values, and its device values once.

On the CPU a device read shows as ``aten._local_scalar_dense`` (``.item()``, ``bool(t)``, ``float(t)``,
``int(t)``); a :class:`TorchDispatchMode` counts the calls made inside the training step. The GPU suite
(``benchmarks/gpu_suite.py``) counts the CUDA synchronizations themselves (``torch.cuda.set_sync_debug_mode``).
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lfed.base.component import Cohort
from lfed.engine.host import device_rows, read_metrics, to_device, values
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.models.zoo import MLP


class ScalarReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense`` calls while ``on``."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.on = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on and func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_the_counter_sees_a_scalar_read():
    """The positive control: the counter is not blind (so the zero counts below can fail)."""
    reads = ScalarReads()
    with reads:
        reads.on = True
        t = torch.tensor([1.0, 2.0])
        float(t.sum()), bool((t > 1).any()), int(t.argmax())
    assert reads.count == 3


def _module(algorithm: str):
    data = dict(dataset="digits", num_clients=20, partition="dirichlet", rho=0.5)
    net = MLP(64, [32], 10)
    kwargs: dict = {"algorithm": algorithm, "fraction": 0.25}
    if algorithm == "dp_fedavg":
        from lfed.privacy import DPFedAvg

        kwargs["combination"] = DPFedAvg(noise_multiplier=0.8, clip=0.5, log_unaccounted=True)  # every metric logged
    elif algorithm == "dp_adaptive":
        from lfed.privacy import DPFedAvg

        kwargs.update(algorithm="dp_fedavg", combination=DPFedAvg(noise_multiplier=0.8, clip=0.5, target_quantile=0.5,
                                                                     count_noise=2.0, log_unaccounted=True))
    elif algorithm == "ditto":
        from lfed.personal.ditto import Ditto

        kwargs["objective"] = Ditto(lam=0.1)
        data.update(partition="classes", classes_per_client=2, holdout_fraction=0.2)
        data.pop("rho")
    elif algorithm in ("perfedavg", "fedrod", "apfl", "fedrep", "fedper", "fedavg_ft"):  # personalized: own splits
        data.update(partition="classes", classes_per_client=2, holdout_fraction=0.2)
        data.pop("rho")
    elif algorithm == "lora":
        pytest.importorskip("peft", reason="LoRA adapters need peft (pip install 'lfed[adapters]')")
        from lfed.models.adapters import LoRA

        kwargs["algorithm"] = "fedavg"
        net = LoRA(net=MLP(64, [32, 32], 10), rank=2, alpha=4, target=["net.0", "net.2"], train=["net.4.*"])
    return FederatedModule(net=net, **kwargs), FederatedDataModule(**data)


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "dp_fedavg", "dp_adaptive", "ditto", "lora",
                                       "efl", "adafl", "dwfed", "igfl", "feddyn", "perfedavg", "fedrod", "apfl",
                                       "fedrep", "fedper", "fedavg_ft"])
def test_a_round_reads_no_device_scalar(algorithm):
    """At most 2 scalar reads per training step (issue 37's bound; there were 37 for FedAvg): the round's checks
    run on host values and its metrics reach the host in one transfer (``lfed.engine.host.read_metrics``)."""
    pl.seed_everything(0)
    module, dm = _module(algorithm)
    reads = ScalarReads()
    per_round: list[int] = []

    class Counted(pl.Callback):
        def on_train_batch_start(self, *args) -> None:
            reads.count, reads.on = 0, True

        def on_train_batch_end(self, *args) -> None:
            reads.on = False
            per_round.append(reads.count)

    rounds = 3
    trainer = pl.Trainer(max_steps=rounds, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, callbacks=[Counted()])
    with reads:
        trainer.fit(module, datamodule=dm)
    assert len(per_round) == rounds
    assert max(per_round) <= 2, per_round
    loss = "unaccounted/train/loss" if algorithm.startswith("dp_") else "train/loss"  # DP marks it (docs/privacy.md)
    assert module.rounds_done == rounds and math.isfinite(trainer.callback_metrics[loss].item())


def test_values_refuses_a_tensor_off_the_host():
    assert values(torch.tensor([3, 1])) == [3, 1]
    with pytest.raises(ValueError, match="wait for the device"):
        values(torch.empty(2, device="meta"))


def test_device_rows_index_as_the_mask_does():
    x = torch.arange(10.0).reshape(5, 2)
    mask = torch.tensor([True, False, True, False, True])
    assert torch.equal(x[device_rows(mask, x.device)], x[mask])
    assert device_rows(torch.zeros(3, dtype=torch.bool), x.device).numel() == 0
    assert torch.equal(to_device(mask, x.device), mask)


def test_read_metrics_reads_tensors_and_flags_by_hand():
    metrics = {"a": 1.5, "b": torch.tensor(2.25, dtype=torch.float64), "c": torch.tensor(3, dtype=torch.int64),
               "d": torch.tensor(float("nan"))}
    flags = {"ok": torch.tensor(True), "bad": torch.isfinite(torch.tensor([1.0, float("inf")])).all()}
    read, got = read_metrics(metrics, flags)
    assert list(read) == ["a", "b", "c", "d"]
    assert read["a"] == 1.5 and read["b"] == 2.25 and read["c"] == 3.0 and math.isnan(read["d"])
    assert all(isinstance(v, float) for v in read.values())
    assert got == {"ok": True, "bad": False}
    assert read_metrics({"x": 2.0}) == ({"x": 2.0}, {})


def test_a_hand_made_cohort_gets_its_host_values_once():
    c = Cohort(0, torch.tensor([4, 7]), torch.tensor([10, 3]), torch.tensor([1, 1]), torch.tensor([1, 0]), 9)
    host = c.host_values()
    assert host is c.host_values()
    assert host.clients.tolist() == [4, 7] and host.active.tolist() == [True, False] and host.counting is None
    c.counting = torch.tensor([True, False])
    assert c.host_values().counting.tolist() == [True, False]


def test_data_keeps_its_host_copies_on_the_device():
    dm = FederatedDataModule(dataset="digits", num_clients=5)
    data = dm.build()
    moved = data.to("cpu", torch.float64)
    assert moved.host("client_sizes") is data.host("client_sizes")
    assert torch.equal(moved.host("label_counts"), data.label_counts.cpu())
    with pytest.raises(ValueError, match="name: one of"):
        data.host("train_x")


def test_a_diverged_round_raises_and_keeps_the_last_good_global_model():
    """NaN is caught from the flags read with the metrics (not before the server step): the run still stops at
    that round, names it, and the global model is the last good round's, not NaN."""
    pl.seed_everything(0)
    module = FederatedModule(net=MLP(64, [32], 10), fraction=0.25, training=dict(client_lr=1e30))
    dm = FederatedDataModule(dataset="digits", num_clients=20)
    seen: list[torch.Tensor] = []

    class Before(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, *args) -> None:
            seen.append(pl_module.layout.module_vector(pl_module.net).clone())

    trainer = pl.Trainer(max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, callbacks=[Before()])
    with pytest.raises(FloatingPointError, match=r"round \d+: .* contain NaN or Inf"):
        trainer.fit(module, datamodule=dm)
    w = module.layout.module_vector(module.net)
    assert torch.isfinite(w).all()
    assert torch.equal(w, seen[-1])  # the failing round's start weights


class ShapeReads(TorchDispatchMode):
    """Counts the ops whose output shape depends on a tensor's values (``nonzero``, a boolean index,
    ``masked_select``, ``unique``): on CUDA each waits for the device to know how much to allocate."""

    DATA_DEPENDENT = {"aten::nonzero", "aten::masked_select", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive"}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        boolean_index = name == "aten::index" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []) if i is not None)
        if name in self.DATA_DEPENDENT or boolean_index:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_the_shape_counter_sees_a_boolean_index():
    x, mask = torch.arange(4.0), torch.tensor([True, False, True, False])
    with ShapeReads() as reads:
        x[mask], mask.nonzero()
    assert len(reads.seen) >= 2


def test_a_masked_write_of_device_rows_has_no_data_dependent_shape():
    """SCAFFOLD's and Ditto's masked writes (inactive clients keep their rows) on the ``device`` placement: the H100
    run of 2026-11-26 saw one CUDA sync per write from a boolean index; ``torch.where`` has none. Same values."""
    from torch import nn

    from lfed.state.spec import StateSpec
    from lfed.state.stores import ClientStateStore

    store, owner = ClientStateStore("device"), nn.Module()
    store.register_owner("o", owner)
    store.allocate(owner, [StateSpec("c")], torch.ones(6, dtype=torch.long), 3, torch.zeros((), dtype=torch.float64))
    clients, mask = torch.tensor([4, 1, 3]), torch.tensor([True, False, True])
    values = torch.arange(9.0, dtype=torch.float64).view(3, 3) + 1
    with ShapeReads() as reads:
        store.write_rows(owner, "c", clients, values, mask=mask)
    assert reads.seen == []
    expected = torch.zeros(6, 3, dtype=torch.float64)
    expected[4], expected[3] = values[0], values[2]
    assert torch.equal(store.rows(owner, "c", torch.arange(6)), expected)
    assert store.participants(owner, "c").tolist() == [3, 4]  # client 1 (masked out) was not written
