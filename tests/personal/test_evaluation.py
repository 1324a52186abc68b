"""Personalized evaluation (SPEC §11): each client's own model and the global model on the client's own
held-out split, for every client (or a seeded sample) in chunked vmapped calls; the summaries, the
FedAvg-FT fine-tuning by hand, and the histogram at the end of a run."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import flat_weights, run_rounds
from test_objectives import BACKENDS, W_INIT, grad, toy_data, toy_module
from torch import nn
from torch.func import functional_call

from lfed.engine.ranks import Ranks
from lfed.evaluation.scores import accuracy_summary, personal_accuracies
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.personal.ditto import Ditto
from lfed.personal.finetune import FedAvgFT


def test_accuracy_summary_by_hand():
    acc = torch.tensor([0.5, 1.0, 0.0, 0.25, float("nan"), 0.75, 1.0, 1.0, 0.5, 0.5, 0.25, 1.0])  # 11 clients, one NaN
    out = accuracy_summary(acc, "personal")
    vals = [0.5, 1.0, 0.0, 0.25, 0.75, 1.0, 1.0, 0.5, 0.5, 0.25, 1.0]
    mean = sum(vals) / 11
    assert out["personal/acc_mean"] == pytest.approx(mean, abs=1e-15)
    assert out["personal/acc_worst10pct"] == pytest.approx((0.0 + 0.25) / 2)  # ceil(0.1 * 11) = 2 worst clients
    assert out["personal/acc_std"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in vals) / 11), abs=1e-15)
    assert set(out) == {"personal/acc_mean", "personal/acc_worst10pct", "personal/acc_std"}


def classification_data(num_clients=7, seed=0, holdout=0.4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, 4, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return FederatedDataModule.from_tensors(x[:240], y[:240], x[240:], y[240:], num_clients=num_clients,
                                            partition="dirichlet", rho=0.3, holdout_fraction=holdout, seed=seed)


def classification_module(objective, backend="vmap", *, training: dict | None = None, engine: dict | None = None, **kwargs):
    """``training`` and ``engine`` are merged over the defaults (client_lr=0.3, batch_size=8, 1 epoch; ``backend``)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    args = dict(algorithm="fedavg", objective=objective, fraction=0.5,
                training={"client_lr": 0.3, "batch_size": 8, "local_epochs": 1, **(training or {})},
                engine={"backend": backend, **(engine or {})}, seed=1)
    args.update(kwargs)
    return FederatedModule(net, **args)


def accuracy_by_hand(net, layout, row, data, k):
    h = int(data.holdout_sizes[k])
    idx = data.holdout_index[k, :h]
    pred = functional_call(net, layout.unflatten(row), (data.train_x[idx],)).argmax(-1)
    return float((pred == data.train_y[idx]).double().mean())


@pytest.mark.parametrize("chunk", [1, 3, 256])
def test_personal_accuracies_one_client_at_a_time_by_hand(chunk):
    dm = classification_data()
    data = dm.build()
    m = classification_module(None)
    run_rounds(m, dm, rounds=1)
    layout, net = m.layout, m.net
    clients = torch.tensor([0, 2, 3, 6])
    g = torch.Generator().manual_seed(5)
    rows = torch.randn(data.num_clients, layout.num_params, generator=g, dtype=torch.float64)
    calls = []

    def rows_of(c):
        calls.append(c.tolist())
        return rows[c]

    got = personal_accuracies(net, layout, data, clients, rows_of, chunk)
    expected = [accuracy_by_hand(net, layout, rows[k], data, k) for k in clients.tolist()]
    assert got.tolist() == expected
    assert calls == [clients[i : i + chunk].tolist() for i in range(0, 4, chunk)]  # chunk clients per call


@pytest.mark.parametrize("backend", BACKENDS)
def test_ditto_evaluation_scores_each_clients_personal_model_and_the_global_one(backend):
    dm = classification_data()
    m = classification_module(Ditto(lam=0.2), backend)
    trainer = run_rounds(m, dm, rounds=3, evaluate_every=3)
    data, run = m.data, m.runs[0]
    has = (data.holdout_sizes > 0).nonzero().squeeze(1)
    assert has.numel() == data.num_clients >= 5
    w = flat_weights(m)
    personal = m.objective.rows("personal", has, first=w)
    trained = m.objective.rows("personal_started", has).bool()
    assert trained.any() and not trained.all()  # some clients never took part: their personal model is w
    own = torch.tensor([accuracy_by_hand(m.net, m.layout, personal[i], data, k) for i, k in enumerate(has.tolist())],
                       dtype=torch.float64)
    glob = torch.tensor([accuracy_by_hand(m.net, m.layout, w, data, k) for k in has.tolist()], dtype=torch.float64)
    logged = trainer.logged_metrics
    for prefix, acc in (("personal", own), ("global", glob)):
        worst = acc.sort().values[: math.ceil(0.1 * acc.numel())].mean()
        assert float(logged[f"{prefix}/acc_mean"]) == pytest.approx(float(acc.mean()), abs=1e-12)
        assert float(logged[f"{prefix}/acc_worst10pct"]) == pytest.approx(float(worst), abs=1e-12)
        assert float(logged[f"{prefix}/acc_std"]) == pytest.approx(float(acc.std(correction=0)), abs=1e-12)
    torch.testing.assert_close(run.last_personal["personal"], own)
    assert not torch.equal(own, glob)


def test_fedavg_logs_global_but_no_personal_accuracies():
    dm = classification_data()
    m = classification_module(None)
    trainer = run_rounds(m, dm, rounds=2, evaluate_every=2)
    assert "global/acc_mean" in trainer.logged_metrics and "personal/acc_mean" not in trainer.logged_metrics
    # the global model on every client's own split: the same clients as client/acc_mean
    assert float(trainer.logged_metrics["global/acc_mean"]) == pytest.approx(float(trainer.logged_metrics["client/acc_mean"]))


def test_a_seeded_sample_of_clients_the_same_at_every_evaluation():
    dm = classification_data(num_clients=12)
    m = classification_module(Ditto(), evaluation=dict(personal_clients=5))
    run_rounds(m, dm, rounds=2, evaluate_every=1)
    run = m.runs[0]
    sample = run.personal_sample()
    assert sample.numel() == 5 and sample.unique().numel() == 5 and torch.equal(sample, sample.sort().values)
    assert torch.equal(run.last_personal["clients"], sample.cpu())
    assert torch.equal(run.personal_sample(), sample)
    other = classification_module(Ditto(), evaluation=dict(personal_clients=5), seed=2)
    run_rounds(other, classification_data(num_clients=12), rounds=1)
    assert not torch.equal(other.runs[0].personal_sample(), sample)  # seeded by the run's seed


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_personal_clients_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="personal_clients"):
        classification_module(None, evaluation=dict(personal_clients=bad))


def test_bad_personal_chunk_is_refused_naming_it():
    with pytest.raises(ValueError, match="personal_chunk"):
        classification_module(None, evaluation=dict(personal_chunk=0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fedavg_ft_fine_tunes_the_global_model_by_hand(backend):
    """Each evaluated client's model: T_ft steps of plain SGD from w at eta_ft on its own data (full batch here)."""
    m = toy_module(FedAvgFT(steps=3, epochs=None, lr=0.05), backend)
    run_rounds(m, toy_data(), rounds=1)
    w = flat_weights(m)
    clients = torch.tensor([2, 0])
    got = m.objective.personal_rows(clients, w, m.runs[0].local_work(clients, Ranks()))
    for i, k in enumerate(clients.tolist()):
        v = w.clone()
        for _ in range(3):
            v = v - 0.05 * grad(v, k)
        torch.testing.assert_close(got[i], v, atol=1e-13, rtol=0)
    # and the global model trained as FedAvg's (FedAvg-FT changes nothing in training)
    ends = []
    for k in range(3):
        v = W_INIT.clone()
        for _ in range(2):
            v = v - 0.1 * grad(v, k)
        ends.append(v)
    sizes = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(w, sum(sizes[k] / sizes.sum() * ends[k] for k in range(3)), atol=1e-13, rtol=0)


def test_fedavg_ft_epochs_are_epochs_of_the_runs_batches():
    ft = FedAvgFT(epochs=2)
    assert ft.fine_tune_steps(torch.tensor([10, 11, 1]), 5).tolist() == [4, 6, 2]
    assert ft.fine_tune_steps(torch.tensor([10, 11]), None).tolist() == [2, 2]


@pytest.mark.parametrize("kwargs, match", [({"epochs": None, "steps": None}, "exactly one"),
                                           ({"epochs": 1, "steps": 2}, "exactly one"),
                                           ({"epochs": 0}, "epochs"), ({"epochs": None, "steps": 0}, "steps"),
                                           ({"lr": 0.0}, "lr")])
def test_fedavg_ft_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedAvgFT(**kwargs)


def test_fedavg_ft_in_a_run_logs_personal_accuracies_and_a_histogram(tmp_path):
    from lightning.pytorch import Trainer
    from lightning.pytorch.loggers import CSVLogger

    dm = classification_data()
    m = classification_module(FedAvgFT(epochs=1))
    trainer = Trainer(max_steps=2, accelerator="cpu", devices=1, logger=CSVLogger(tmp_path, name="run"),
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, precision="64-true", check_val_every_n_epoch=None, val_check_interval=2,
                      default_root_dir=tmp_path)
    trainer.fit(m, datamodule=dm)
    assert {"personal/acc_mean", "personal/acc_worst10pct", "personal/acc_std"} <= set(trainer.logged_metrics)
    assert (tmp_path / "run" / "version_0" / "personal_accuracy.png").stat().st_size > 1000
    header = (tmp_path / "run" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"personal/acc_mean", "global/acc_worst10pct", "global/acc_std"} <= set(header)
    no_logger = classification_module(FedAvgFT(epochs=1))
    run_rounds(no_logger, classification_data(), rounds=1, evaluate_every=1, default_root_dir=tmp_path / "quiet")
    assert not list((tmp_path / "quiet").rglob("*.png"))  # no logger, no run directory: no file
