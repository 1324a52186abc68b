"""Each client's own validation split (``data.client_validation_fraction``) and what is scored on it: the
split's sizes and disjointness by hand, the personalized and global models' accuracies on it
(``personal_val/*``, ``global_val/*``) by hand, per-client perplexity on token data by hand, and the
switch that skips the per-round local accuracy of the cohort."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import flat_weights, run_rounds
from test_evaluation import accuracy_by_hand, classification_module
from torch import nn
from torch.func import functional_call

from lfed.evaluation.scores import own_split_scores, perplexity_summary, personal_scores
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.personal.ditto import Ditto


def data_module(client_val=0.25, holdout=0.2, seed=0, num_clients=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, 4, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return FederatedDataModule.from_tensors(x[:240], y[:240], x[240:], y[240:], num_clients=num_clients,
                                            partition="dirichlet", rho=0.3, holdout_fraction=holdout,
                                            client_validation_fraction=client_val, seed=seed)


def rows_of(index, sizes, k):
    return set(index[k, : int(sizes[k])].tolist())


def test_client_validation_split_sizes_disjoint_and_seeded_by_hand():
    plain = data_module(client_val=0.0).build()
    d = data_module(client_val=0.25).build()
    assert plain.client_val_index is None and not plain.has_client_validation
    assert d.has_client_validation
    assert torch.equal(d.holdout_index, plain.holdout_index) and torch.equal(d.holdout_sizes, plain.holdout_sizes)
    for k in range(d.num_clients):
        n_rest = int(plain.client_sizes[k])  # what the client trained on without a validation split
        v = min(math.floor(0.25 * n_rest + 0.5), n_rest - 1)  # rounded half up, at least one training example left
        assert int(d.client_val_sizes[k]) == v and int(d.client_sizes[k]) == n_rest - v
        train = rows_of(d.client_index, d.client_sizes, k)
        val = rows_of(d.client_val_index, d.client_val_sizes, k)
        test = rows_of(d.holdout_index, d.holdout_sizes, k)
        assert not train & val and not val & test and not train & test
        assert train | val == rows_of(plain.client_index, plain.client_sizes, k)  # taken from what it trained on
    labels = torch.zeros_like(d.label_counts)  # the clients' label counts count what they train on only
    for k in range(d.num_clients):
        for i in rows_of(d.client_index, d.client_sizes, k):
            labels[k, int(d.train_y[i])] += 1
    assert torch.equal(labels, d.label_counts)
    again = data_module(client_val=0.25).build()
    assert torch.equal(again.client_val_index, d.client_val_index)
    other = data_module(client_val=0.25, seed=1).build()
    assert not torch.equal(other.client_val_sizes, d.client_val_sizes) or not torch.equal(
        other.client_val_index, d.client_val_index)


@pytest.mark.parametrize("bad", [-0.1, 1.0, True])
def test_client_validation_fraction_out_of_range_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="client_validation_fraction"):
        data_module(client_val=bad)


def test_the_val_split_without_client_validation_is_refused_naming_the_setting():
    d = data_module(client_val=0.0).build()
    with pytest.raises(ValueError, match="client_validation_fraction"):
        d.own_split("val")
    with pytest.raises(ValueError, match="split"):
        d.own_split("train")


@pytest.mark.parametrize("batch", [None, 1, 5, 1000])
def test_own_split_scores_accuracy_and_nll_by_hand(batch):
    d = data_module().build()
    torch.manual_seed(3)
    net = nn.Linear(4, 3).double()
    from lfed.engine.params import ParamLayout

    layout = ParamLayout.from_module(net)
    rows = torch.randn(3, layout.num_params, dtype=torch.float64)
    clients = torch.tensor([4, 0, 2])
    for split in ("test", "val"):
        acc, nll = own_split_scores(net, layout, rows, d, clients, chunk=2, split=split, nll=True, batch=batch)
        index, sizes = d.own_split(split)
        for i, k in enumerate(clients.tolist()):
            idx = index[k, : int(sizes[k])]
            p = functional_call(net, layout.unflatten(rows[i]), (d.train_x[idx],))
            y = d.train_y[idx]
            assert float(acc[i]) == pytest.approx(float((p.argmax(-1) == y).double().mean()), abs=1e-15)
            by_hand = -sum(float(torch.log_softmax(p[j], -1)[y[j]]) for j in range(idx.numel())) / idx.numel()
            assert float(nll[i]) == pytest.approx(by_hand, abs=1e-12)
    out = perplexity_summary(torch.tensor([0.0, math.log(4.0), float("nan"), math.log(2.0)]), "personal")
    assert out["personal/perplexity_mean"] == pytest.approx((1 + 4 + 2) / 3)
    assert out["personal/perplexity_worst10pct"] == pytest.approx(4.0)  # ceil(0.1 * 3) = 1: the highest


def test_personal_scores_make_each_chunks_models_once_for_both_splits():
    d = data_module().build()
    net = nn.Linear(4, 3).double()
    from lfed.engine.params import ParamLayout

    layout = ParamLayout.from_module(net)
    rows = torch.randn(d.num_clients, layout.num_params, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    calls = []

    def make(c):
        calls.append(c.tolist())
        return rows[c]

    clients = torch.arange(d.num_clients)
    out = personal_scores(net, layout, d, clients, make, chunk=4, splits=("test", "val"))
    assert calls == [[0, 1, 2, 3], [4, 5]]
    for split in ("test", "val"):
        torch.testing.assert_close(out[split][0], own_split_scores(net, layout, rows, d, clients, split=split)[0])


def test_ditto_logs_personal_and_global_accuracies_on_each_clients_validation_split_by_hand():
    dm = data_module()
    m = classification_module(Ditto(lam=0.2))
    trainer = run_rounds(m, dm, rounds=3, evaluate_every=3)
    d = m.data
    has = (d.holdout_sizes > 0).nonzero().squeeze(1)
    w = flat_weights(m)
    personal = m.objective.rows("personal", has, first=w)
    logged = trainer.logged_metrics

    def on_val(row, k):
        idx = d.client_val_index[k, : int(d.client_val_sizes[k])]
        pred = functional_call(m.net, m.layout.unflatten(row), (d.train_x[idx],)).argmax(-1)
        return float((pred == d.train_y[idx]).double().mean())

    for prefix, acc in (("personal_val", [on_val(personal[i], k) for i, k in enumerate(has.tolist())]),
                        ("global_val", [on_val(w, k) for k in has.tolist()]),
                        ("personal", [accuracy_by_hand(m.net, m.layout, personal[i], d, k) for i, k in enumerate(has.tolist())])):
        acc = torch.tensor(acc, dtype=torch.float64)
        assert float(logged[f"{prefix}/acc_mean"]) == pytest.approx(float(acc.mean()), abs=1e-12)
        worst = acc.sort().values[: math.ceil(0.1 * acc.numel())].mean()
        assert float(logged[f"{prefix}/acc_worst10pct"]) == pytest.approx(float(worst), abs=1e-12)
    assert "personal/perplexity_mean" not in logged  # not token data


def test_fedavg_logs_the_global_model_on_the_validation_splits_only():
    m = classification_module(None)
    trainer = run_rounds(m, data_module(), rounds=2, evaluate_every=2)
    assert "global_val/acc_mean" in trainer.logged_metrics and "personal_val/acc_mean" not in trainer.logged_metrics


def token_data(num_clients=3, vocab=7, seq=5):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (90, seq), generator=g)
    y = torch.randint(0, vocab, (90,), generator=g)
    return FederatedDataModule.from_tensors(x[:72], y[:72], x[72:], y[72:], num_clients=num_clients, partition="iid",
                                            holdout_fraction=0.25, client_validation_fraction=0.2, num_classes=vocab)


class BagOfTokens(nn.Module):
    def __init__(self, vocab=7):
        super().__init__()
        self.emb = nn.Embedding(vocab, 6)
        self.out = nn.Linear(6, vocab)

    def forward(self, x):
        return self.out(self.emb(x).mean(1))


def test_token_data_logs_each_clients_perplexity_by_hand():
    dm = token_data()
    torch.manual_seed(0)
    m = FederatedModule(BagOfTokens().double(), algorithm="fedavg", objective=Ditto(lam=0.1), fraction=1.0,
                        training=dict(client_lr=0.5, batch_size=4, local_steps=2), seed=0)
    trainer = run_rounds(m, dm, rounds=2, evaluate_every=2)
    d, logged = m.data, trainer.logged_metrics
    clients = torch.arange(d.num_clients)
    w = flat_weights(m)
    personal = m.objective.rows("personal", clients, first=w)

    def ppl(row, k, split):
        index, sizes = d.own_split(split)
        idx = index[k, : int(sizes[k])]
        logits = functional_call(m.net, m.layout.unflatten(row), (d.train_x[idx],))
        return math.exp(float(nn.functional.cross_entropy(logits, d.train_y[idx])))

    for prefix, row_of, split in (("personal", lambda k: personal[k], "test"), ("global", lambda k: w, "test"),
                                  ("personal_val", lambda k: personal[k], "val"), ("global_val", lambda k: w, "val")):
        values = torch.tensor([ppl(row_of(k), k, split) for k in range(d.num_clients)], dtype=torch.float64)
        assert float(logged[f"{prefix}/perplexity_mean"]) == pytest.approx(float(values.mean()), rel=1e-9)
        assert float(logged[f"{prefix}/perplexity_worst10pct"]) == pytest.approx(float(values.max()), rel=1e-9)
    glob = torch.tensor([ppl(w, k, "test") for k in range(d.num_clients)], dtype=torch.float64)
    assert float(logged["client/perplexity_mean"]) == pytest.approx(float(glob.mean()), rel=1e-9)  # every client's
    assert float(logged["client/perplexity_worst10pct"]) == pytest.approx(float(glob.max()), rel=1e-9)  # held-out split


def test_round_local_accuracy_false_skips_the_cohorts_local_accuracy():
    on = classification_module(None)
    off = classification_module(None, evaluation=dict(round_local_accuracy=False))
    t_on = run_rounds(on, data_module(), rounds=2, evaluate_every=2)
    t_off = run_rounds(off, data_module(), rounds=2, evaluate_every=2)
    assert "client/local_acc_mean" in t_on.callback_metrics and "client/local_acc_mean" not in t_off.callback_metrics
    assert "final/bmta_local" in on.runs[0].summary() and "final/bmta_local" not in off.runs[0].summary()
    torch.testing.assert_close(flat_weights(on), flat_weights(off), rtol=0, atol=0)  # training is the same
    with pytest.raises(ValueError, match="round_local_accuracy"):
        classification_module(None, evaluation=dict(round_local_accuracy="yes"))
