"""lfed.evaluation.scores: test loss of any loss form, regression, the net's output checked before round 0,
the evaluation after the last round, the round schedule refused early, the resumable rounds loader."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import run_rounds
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lfed.evaluation.scores import evaluate_split, per_example_loss
from lfed.lightning.datamodule import FederatedDataModule, RoundsLoader
from lfed.lightning.module import FederatedModule


def _three_point_test(**dm_kwargs):
    """Train: 12 points of classes 0..2; test: 3 points, labels 0, 1, 2."""
    train_x = torch.randn(12, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    train_y = torch.arange(12) % 3
    test_x = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [3.0, -2.0]], dtype=torch.float64)
    test_y = torch.tensor([0, 1, 2])
    dm_kwargs.setdefault("eval_batch_size", 2)  # batches of 2 and 1: partial batches count right
    return FederatedDataModule.from_tensors(train_x, train_y, test_x, test_y, num_clients=2, partition="iid",
                                            holdout_fraction=0.0, **dm_kwargs)


def _fixed_net():
    """Logits (0, ln 2, 0) for every input: softmax (1/4, 1/2, 1/4)."""
    net = nn.Linear(2, 3).double()
    with torch.no_grad():
        net.weight.zero_()
        net.bias.copy_(torch.tensor([0.0, math.log(2.0), 0.0], dtype=torch.float64))
    return net


def _test_metrics(module, dm):
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)
    return trainer.test(module, datamodule=dm, verbose=False)[0]


@pytest.mark.parametrize(
    "loss",
    [
        None,
        nn.CrossEntropyLoss(),
        F.cross_entropy,  # a plain function, reduction mean
        lambda out, y: F.cross_entropy(out, y, reduction="sum"),
        lambda out, y: F.cross_entropy(out, y, reduction="none"),
    ],
    ids=["default", "module", "F.cross_entropy", "lambda-sum", "lambda-none"],
)
def test_test_loss_is_the_mean_per_example_loss_whatever_the_loss_form(loss):
    # by hand: labels 0, 1, 2 under softmax (1/4, 1/2, 1/4): losses ln 4, ln 2, ln 4
    want_loss = (math.log(4) + math.log(2) + math.log(4)) / 3  # 5 ln2 / 3 = 1.1552
    metrics = _test_metrics(FederatedModule(_fixed_net(), loss=loss), _three_point_test())
    assert metrics["test/loss"] == pytest.approx(want_loss, rel=1e-6)
    assert metrics["test/acc"] == pytest.approx(1 / 3)


def test_per_example_loss_of_a_reduced_function_by_hand():
    out = torch.tensor([[2.0], [0.0], [1.0]])
    y = torch.tensor([[0.0], [0.0], [3.0]])
    want = torch.tensor([4.0, 0.0, 4.0])
    assert torch.equal(per_example_loss(F.mse_loss, out, y), want)  # mean-reduced
    assert torch.equal(per_example_loss(lambda o, t: ((o - t) ** 2).sum(), out, y), want)  # sum-reduced
    assert torch.equal(per_example_loss(nn.MSELoss(reduction="none"), out, y), want)  # [B, 1] per example
    with pytest.raises(ValueError, match=r"loss: returned shape \(2,\) for a batch of 3"):
        per_example_loss(lambda o, t: torch.zeros(2), out, y)


def test_evaluation_adds_batches_exactly_and_each_example_once_over_the_ranks():
    from lfed.engine.ranks import Ranks

    net = _fixed_net()
    x, y = torch.zeros(3, 2, dtype=torch.float64), torch.tensor([0, 1, 1])
    want_loss, want_acc = (math.log(4) + 2 * math.log(2)) / 3, 2 / 3
    got = evaluate_split(net, F.cross_entropy, x, y, Ranks(), lambda t: t, 2, classification=True)  # batches of 2 + 1
    assert got["test/loss"] == pytest.approx(want_loss, rel=1e-12)
    assert got["test/acc"] == pytest.approx(want_acc, rel=1e-12)
    # two ranks, each its contiguous share ([0, 1) and [1, 3)), reduced by summing the (loss, correct, count) sums
    sums = []
    for r in (0, 1):
        evaluate_split(net, F.cross_entropy, x, y, Ranks(r, 2), lambda t: sums.append(t) or t, 2, classification=True)
    total = sums[0] + sums[1]
    assert sums[0][2] == 1 and sums[1][2] == 2  # each example on one rank only
    assert float(total[0] / total[2]) == pytest.approx(want_loss, rel=1e-12)
    assert float(total[1] / total[2]) == pytest.approx(want_acc, rel=1e-12)


# ----------------------------------------------------------------------------- regression (item 5)


def _regression(n=120, partition="iid", **kwargs):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    y = x @ torch.tensor([1.5, -2.0, 0.5]) + 0.25  # float targets, 1-D
    return FederatedDataModule.from_tensors(x[:96], y[:96], x[96:], y[96:], num_clients=4, partition=partition,
                                            holdout_fraction=0.0, **kwargs)


def test_regression_keeps_float_targets_trains_with_mse_and_logs_the_loss_only():
    dm = _regression()
    d = dm.build()
    assert d.task == "regression" and d.num_classes is None
    assert d.train_y.dtype == torch.float32 and d.train_y.shape == (96, 1)  # not cast to integers
    assert d.train_y[:, 0].tolist() == pytest.approx((d.train_x @ torch.tensor([1.5, -2.0, 0.5]) + 0.25).tolist())
    torch.manual_seed(0)
    m = FederatedModule(nn.Linear(3, 1), loss=nn.MSELoss(), training=dict(client_lr=0.05, batch_size=8), fraction=1.0)
    trainer = run_rounds(m, dm, 20, evaluate_every=20)
    metrics = trainer.callback_metrics
    assert "test/acc" not in metrics and "client/acc_mean" not in metrics
    with torch.no_grad():
        d64 = m.data
        want = ((m.net(d64.test_x) - d64.test_y) ** 2).mean().item()  # by hand: mean squared error
    assert float(metrics["test/loss"]) == pytest.approx(want, rel=1e-5)
    start = ((d.test_y - 0.0) ** 2).mean().item()  # an untrained model is far worse
    assert want < 0.05 * start


@pytest.mark.parametrize(
    "dm_kwargs, module_kwargs, match",
    [
        ({"partition": "dirichlet"}, {"loss": nn.MSELoss()}, r"partition: 'dirichlet' splits by class label.*regression.*iid"),
        ({}, {"loss": nn.MSELoss(), "weighting": "dwfed"}, r"weighting='dwfed' \(label-count weights\) needs class labels"),
        ({}, {}, r"loss: the default \(cross-entropy\) needs class labels.*MSELoss"),
        ({"num_classes": 3}, {"loss": nn.MSELoss()}, r"num_classes: given, but the targets are floating"),
    ],
    ids=["partition", "dwfed", "default-loss", "num_classes"],
)
def test_label_based_pieces_refuse_regression_before_round_0(dm_kwargs, module_kwargs, match):
    m = FederatedModule(nn.Linear(3, 1), **module_kwargs)
    with pytest.raises(ValueError, match=match):
        run_rounds(m, _regression(**dm_kwargs), 2)
    assert m.comm.rounds == 0


# ----------------------------------------------------------------------------- the net against the data (item 4)


@pytest.mark.parametrize("width", [9, 11])
def test_a_net_of_the_wrong_output_width_is_refused_before_round_0(width):
    m = FederatedModule(nn.Sequential(nn.Flatten(), nn.Linear(64, width)))
    dm = FederatedDataModule(dataset="digits", num_clients=4, partition="iid")
    with pytest.raises(ValueError, match=rf"net: outputs shape \({width},\) per example, but the data has 10 classes"):
        run_rounds(m, dm, 2)
    assert m.comm.rounds == 0


def test_a_regression_net_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match=r"net: outputs shape \(2,\) per example, but the regression targets have shape \(1,\)"):
        run_rounds(FederatedModule(nn.Linear(3, 2), loss=nn.MSELoss()), _regression(), 2)


def test_test_labels_outside_the_training_classes_are_refused_at_build():
    x = torch.randn(20, 2)
    dm = FederatedDataModule.from_tensors(x, torch.arange(20) % 9, x[:4], torch.tensor([0, 3, 9, 1]), num_clients=2,
                                          partition="iid")
    with pytest.raises(ValueError, match=r"test labels: label 9 is outside the training classes \[0, 9\)"):
        dm.build()
    # said explicitly, a class missing from training is allowed
    assert FederatedDataModule.from_tensors(x, torch.arange(20) % 9, x[:4], torch.tensor([0, 3, 9, 1]), num_clients=2,
                                            partition="iid", num_classes=10).build().num_classes == 10


# ----------------------------------------------------------------------------- the last round is evaluated (item 10)


@pytest.mark.parametrize("rounds, every, want", [(25, 10, [10, 20, 25]), (3, 10, [3]), (20, 10, [10, 20])])
def test_the_global_model_is_evaluated_after_the_last_round(rounds, every, want):
    m = FederatedModule(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), training=dict(client_lr=0.1, local_steps=1))
    trainer = run_rounds(m, FederatedDataModule(dataset="digits", num_clients=4, partition="iid"), rounds,
                         evaluate_every=every)
    assert [r for r, _ in m.eval_history] == want
    assert "test/acc" in trainer.callback_metrics and trainer.global_step == rounds


# ----------------------------------------------------------------------------- the round schedule (item 6)


@pytest.mark.parametrize(
    "trainer_kwargs, match",
    [
        ({"max_steps": 0}, r"trainer.max_steps: 0 rounds would run"),
        ({"max_steps": 3, "val_check_interval": 0}, r"trainer.val_check_interval: .* int >= 1, got 0"),
    ],
    ids=["max_steps-0", "val_check_interval-0"],
)
def test_a_schedule_that_runs_nothing_or_crashes_is_refused_before_round_0(trainer_kwargs, match):
    m = FederatedModule(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, check_val_every_n_epoch=None, **trainer_kwargs)
    with pytest.raises(ValueError, match=match):
        trainer.fit(m, datamodule=FederatedDataModule(dataset="digits", num_clients=4, partition="iid"))
    assert m.comm.rounds == 0


# ----------------------------------------------------------------------------- resumable rounds loader (item 14)


class _Batches(Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append((int(trainer.global_step), int(batch)))


def test_rounds_loader_state_round_trip():
    loader = RoundsLoader(6, lambda: 4)
    assert list(loader) == [0, 1, 2, 3, 4, 5] and len(loader) == 6
    state = loader.state_dict()
    assert state == {"rounds_done": 4}
    fresh = RoundsLoader(6)
    fresh.load_state_dict(state)
    assert list(fresh) == [4, 5] and list(fresh) == [0, 1, 2, 3, 4, 5]  # the resume applies once


def test_exact_resume_mid_run_raises_no_dataloader_warning_and_continues_from_the_next_round(tmp_path):
    def fit(ckpt_path=None):
        torch.manual_seed(0)
        m = FederatedModule(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), training=dict(client_lr=0.1, local_steps=1))
        batches = _Batches()
        ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
        trainer = Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0, check_val_every_n_epoch=None,
                          val_check_interval=6, limit_val_batches=0, callbacks=[ckpt, batches])
        trainer.fit(m, datamodule=FederatedDataModule(dataset="digits", num_clients=4, partition="iid"),
                    ckpt_path=ckpt_path)
        return m, batches.seen

    full, seen = fit()
    assert seen == [(r, r) for r in range(6)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, seen = fit(tmp_path / "epoch=0-step=3.ckpt")
    assert not [w for w in caught if "not resumable" in str(w.message)]
    assert seen == [(3, 3), (4, 4), (5, 5)]  # the loader goes on from round 3, as the trainer does
    assert torch.equal(resumed.layout.module_vector(resumed.net), full.layout.module_vector(full.net))


# ----------------------------------------------------------------------------- BMTA, both readings (SPEC §9)


def _tiny_fed():
    """4 clients; inputs are one-hot rows of 2 features; held-out positions by hand."""
    from lfed.lightning.datamodule import FederatedData

    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 1, 0, 0])
    # held out: client 0 -> examples 0, 1 (labels 0, 1); client 1 -> 2 (label 1); client 2 -> none; client 3 -> 4, 5
    holdout_index = torch.tensor([[0, 1], [2, 0], [0, 0], [4, 5]])
    holdout_sizes = torch.tensor([2, 1, 0, 2])
    return FederatedData(x, y, x, y, torch.zeros(4, 1, dtype=torch.long), torch.ones(4, dtype=torch.long),
                         holdout_index, holdout_sizes, torch.zeros(4, 2, dtype=torch.long), 2)


def test_local_accuracy_of_each_clients_own_weights_by_hand():
    from lfed.engine.params import ParamLayout
    from lfed.evaluation.scores import local_accuracy

    net = nn.Linear(2, 2, bias=False).double()
    layout = ParamLayout.from_module(net)
    identity = torch.eye(2, dtype=torch.float64).reshape(-1)  # predicts class = the hot feature
    swap = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64).reshape(-1)  # the other class
    weights = torch.stack([identity, swap, identity, swap])
    acc = local_accuracy(net, layout, weights, _tiny_fed(), torch.tensor([0, 1, 2, 3]))
    # client 0: identity on (e0->0 ok, e1->1 ok) = 1; client 1: swap on e0 (label 1) -> 1 ok = 1;
    # client 2: no held-out split; client 3: swap on (e0 label 0 -> 1 wrong, e1 label 0 -> 0 ok) = 1/2
    assert acc[[0, 1, 3]].tolist() == [1.0, 1.0, 0.5] and torch.isnan(acc[2])
    # the cohort in another order and a subset: the same per-client values
    assert local_accuracy(net, layout, weights[[3, 0]], _tiny_fed(), torch.tensor([3, 0])).tolist() == [0.5, 1.0]


def test_bmta_global_and_local_are_best_over_rounds_of_participant_means_by_hand():
    from lfed.evaluation.scores import BestMeanAccuracy

    b = BestMeanAccuracy()
    nan = float("nan")
    assert b.add_evaluation(torch.tensor([1.0, 1.0, 1.0])) is None  # no round yet: nothing
    assert b.add_round(torch.tensor([0, 2]), torch.tensor([0.5, nan])) == 0.5  # client 2 has no held-out split
    assert b.add_evaluation(torch.tensor([0.2, 0.9, 0.6])) == pytest.approx(0.4)  # mean of clients 0, 2
    assert b.add_round(torch.tensor([1, 2]), torch.tensor([0.25, 0.75])) == 0.5
    assert b.add_evaluation(torch.tensor([0.2, 0.9, nan])) == pytest.approx(0.9)  # clients 1, 2(no split)
    assert b.add_round(torch.tensor([0, 1]), torch.tensor([0.8, 0.4])) == pytest.approx(0.6)
    assert b.add_evaluation(torch.tensor([0.1, 0.3, 0.5])) == pytest.approx(0.2)
    assert b.summary() == {"final/bmta_global": pytest.approx(0.9), "final/bmta_local": pytest.approx(0.6)}
    again = BestMeanAccuracy()
    again.load_state_dict(b.state_dict())
    assert again.summary() == b.summary() and again.last_cohort.tolist() == [0, 1]


def test_bmta_is_logged_at_the_end_of_a_run():
    torch.manual_seed(0)
    m = FederatedModule(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), training=dict(client_lr=0.1, local_steps=2), fraction=0.5)
    seen = []

    class Spy(Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            acc = pl_module.runs[0].client_accuracy()
            seen.append(float(acc[pl_module.bmta.last_cohort].nanmean()))

    run_rounds(m, FederatedDataModule(dataset="digits", num_clients=6, partition="iid"), 4, evaluate_every=2,
               callbacks=[Spy()])
    assert m.final_summary["final/bmta_global"] == pytest.approx(max(seen))
    assert 0.0 < m.final_summary["final/bmta_local"] <= 1.0


def test_client_evaluation_gives_each_clients_accuracy_and_mean_nll_by_hand():
    """Logits from the last token: token 0 -> (0, 0), 1 -> (ln 3, 0), 2 -> (0, ln 3), i.e. probabilities
    (1/2, 1/2), (3/4, 1/4), (1/4, 3/4). Client 0 holds out (token 1, class 0) and (token 2, class 0):
    NLL ln(4/3) and ln 4, accuracy 1/2; client 1 holds out (token 0, class 1): NLL ln 2, accuracy 0 (a tie
    picks class 0); client 2 holds out nothing."""
    from types import SimpleNamespace

    from lfed.evaluation.scores import client_evaluation

    class LastToken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.tensor([[0.0, 0.0], [math.log(3), 0.0], [0.0, math.log(3)]], dtype=torch.float64)

        def forward(self, x):
            return self.table[x[:, -1]]

    data = SimpleNamespace(
        train_x=torch.tensor([[0, 1], [2, 2], [1, 0], [0, 0]]), train_y=torch.tensor([0, 0, 1, 1]), num_clients=3,
        holdout_index=torch.tensor([[0, 1], [2, 0], [0, 0]]), holdout_sizes=torch.tensor([2, 1, 0]))
    acc, nll = client_evaluation(LastToken(), data, 0, 1, lambda t: t)
    torch.testing.assert_close(acc[:2], torch.tensor([0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(nll[:2], torch.tensor([(math.log(4 / 3) + math.log(4)) / 2, math.log(2)], dtype=torch.float64))
    assert torch.isnan(acc[2]) and torch.isnan(nll[2])
    assert float(nll[0].exp()) == pytest.approx(math.sqrt(16 / 3))  # client 0's perplexity
    # two ranks, each its contiguous share of the 3 held-out examples (1 and 2): their parts add up to the whole
    halves = [client_evaluation(LastToken(), data, r, 2, lambda t: t) for r in (0, 1)]
    torch.testing.assert_close(halves[0][1][:2] + halves[1][1][:2], nll[:2])
    torch.testing.assert_close(halves[0][1][:2], torch.tensor([math.log(4 / 3) / 2, 0.0], dtype=torch.float64))
    assert client_evaluation(LastToken(), data, 0, 1, lambda t: t, nll=False)[1] is None


# ------------------------------------------------------------------ evaluation mode, whoever drives the run (issue 62, item 11)


def _bn_net():
    """BatchNorm1d(2) with running statistics (1, -1) / (4, 0.25), γ = (2, 1), β = (0, 1), then a fixed linear map."""
    net = nn.Sequential(nn.BatchNorm1d(2), nn.Linear(2, 3)).double()
    with torch.no_grad():
        net[0].running_mean.copy_(torch.tensor([1.0, -1.0]))
        net[0].running_var.copy_(torch.tensor([4.0, 0.25]))
        net[0].num_batches_tracked.fill_(7)
        net[0].weight.copy_(torch.tensor([2.0, 1.0]))
        net[0].bias.copy_(torch.tensor([0.0, 1.0]))
        net[1].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]))
        net[1].bias.zero_()
    return net.train()  # as fit_run leaves it: training mode


def _by_hand(x):
    """The logits of :func:`_bn_net` in evaluation mode, written out: (x - r_μ) / √(r_σ² + ε) γ + β, then the map."""
    h = (x - torch.tensor([1.0, -1.0], dtype=torch.float64)) / torch.sqrt(torch.tensor([4.0, 0.25], dtype=torch.float64) + 1e-5)
    h = h * torch.tensor([2.0, 1.0], dtype=torch.float64) + torch.tensor([0.0, 1.0], dtype=torch.float64)
    return torch.stack([h[:, 0], h[:, 1], -h[:, 0] - h[:, 1]], 1)


def test_evaluation_reads_the_running_statistics_and_writes_none_whatever_mode_the_net_is_in():
    from types import SimpleNamespace

    from lfed.engine.ranks import Ranks
    from lfed.evaluation.scores import client_evaluation

    # batches of 2 and 1 (a batch of one would raise in training mode); each batch's own statistics would give other logits
    x = torch.tensor([[3.0, -1.0], [1.0, 0.0], [-2.0, -1.5]], dtype=torch.float64)
    y = torch.tensor([0, 1, 0])
    net = _bn_net()
    before = {k: v.clone() for k, v in net.named_buffers()}
    logits = _by_hand(x)  # h = (2, 1), (0, 3), (-3, 0): logits (2, 1, -3), (0, 3, -3), (-3, 0, 3): classes 0, 1, 2
    want_loss = float(F.cross_entropy(logits, y))
    got = evaluate_split(net, F.cross_entropy, x, y, Ranks(), lambda t: t, 2, True)
    assert got["test/acc"] == pytest.approx(2 / 3, abs=0) and got["test/loss"] == pytest.approx(want_loss, rel=1e-14)
    data = SimpleNamespace(train_x=x, train_y=y, num_clients=2, holdout_index=torch.tensor([[0, 1], [2, 0]]),
                           holdout_sizes=torch.tensor([2, 1]))
    acc, nll = client_evaluation(net, data, 0, 1, lambda t: t, chunk=2)
    assert acc.tolist() == [1.0, 0.0]
    per = F.cross_entropy(logits, y, reduction="none")
    torch.testing.assert_close(nll, torch.stack([per[:2].mean(), per[2:].mean()]), rtol=1e-14, atol=0)
    assert net.training and net[0].training  # each module's mode put back
    assert all(torch.equal(before[k], v) for k, v in net.named_buffers())  # no running statistic moved, none counted
    frozen = _bn_net()
    frozen[0].eval()  # a part its owner keeps in eval(): it stays so, the rest goes back to training
    evaluate_split(frozen, F.cross_entropy, x, y, Ranks(), lambda t: t, 2, True)
    assert frozen.training and not frozen[0].training


def _digits_bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_fit_run_and_the_lightning_module_report_the_same_evaluation_of_a_batchnorm_net(backend, one_thread):
    from lfed.core.algorithm import LocalTraining
    from lfed.core.fit import fit_run
    from lfed.core.settings import Engine, build_run
    from lfed.engine.ranks import Ranks

    def digits():
        return FederatedDataModule(dataset="digits", num_clients=10, partition="dirichlet", rho=0.5, seed=0)

    training = LocalTraining(client_lr=0.1, batch_size=8, local_steps=3)  # 3 x 8 of 114-115 examples: no batch of one
    module = FederatedModule(_digits_bn_net(), fraction=0.3, training=training, engine=Engine(backend=backend), seed=3)
    trainer = run_rounds(module, digits(), 2, evaluate_every=2, precision="32-true")
    run = build_run(net=_digits_bn_net(), fraction=0.3, training=training, engine=Engine(backend=backend), seed=3)
    history = fit_run(run, digits(), 2)
    lightning_net = module.runs[0].net
    for (name, a), b in zip(lightning_net.state_dict().items(), run.net.state_dict().values()):
        assert torch.equal(a, b), name  # the same weights and the same running statistics, after the evaluations
    assert run.net[2].num_batches_tracked.item() > 0  # the cohort's statistics were aggregated (a real BatchNorm state)
    for key in ("test/acc", "test/loss", "client/acc_mean"):
        assert history[-1][key] == pytest.approx(float(trainer.callback_metrics[key]), abs=1e-6), key
    before = {k: v.clone() for k, v in run.net.named_buffers()}
    again, _ = run.evaluate(Ranks(), lambda t: t)  # evaluating again: the same numbers, no buffer moved
    assert again["test/acc"] == history[-1]["test/acc"] and again["test/loss"] == history[-1]["test/loss"]
    assert all(torch.equal(before[k], v) for k, v in run.net.named_buffers()) and run.net.training


# ------------------------------------------------------------------ evaluation that scales (issue 65)
def test_client_evaluation_of_a_sample_scores_those_clients_only_by_hand():
    """The hand example of test_client_evaluation_gives_each_clients_accuracy_and_mean_nll_by_hand with
    clients=[1]: client 1's accuracy 0 and NLL ln 2, as in the whole; client 0 (not in the sample) reads NaN; an empty
    sample of held-out splits gives None."""
    from types import SimpleNamespace

    from lfed.evaluation.scores import client_evaluation

    table = torch.tensor([[0.0, 0.0], [math.log(3), 0.0], [0.0, math.log(3)]], dtype=torch.float64)
    net = type("N", (torch.nn.Module,), {"forward": lambda self, x: table[x[:, -1]]})()
    data = SimpleNamespace(
        train_x=torch.tensor([[0, 1], [2, 2], [1, 0], [0, 0]]), train_y=torch.tensor([0, 0, 1, 1]), num_clients=3,
        holdout_index=torch.tensor([[0, 1], [2, 0], [0, 0]]), holdout_sizes=torch.tensor([2, 1, 0]))
    acc, nll = client_evaluation(net, data, 0, 1, lambda t: t, clients=torch.tensor([1]))
    assert acc[1].item() == 0.0 and nll[1].item() == pytest.approx(math.log(2), abs=1e-15)
    assert torch.isnan(acc[0]) and torch.isnan(acc[2]) and torch.isnan(nll[0])
    assert client_evaluation(net, data, 0, 1, lambda t: t, clients=torch.tensor([2])) is None


def test_the_sample_means_standard_error_by_hand():
    """Values (1, 2, 3, 6) of a population of 10: s = √(14/3), se = s/2 · √(1 - 4/10); the whole population: 0."""
    from lfed.evaluation.scores import sample_mean_se

    values = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    assert sample_mean_se(values, 10) == pytest.approx(math.sqrt(14 / 3) / 2 * math.sqrt(0.6), rel=1e-14)
    assert sample_mean_se(values, 4) == 0.0
    assert math.isnan(sample_mean_se(values[:1], 10))


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_a_run_scores_a_fixed_seeded_sample_of_its_clients_and_logs_the_standard_error(backend):
    """8 clients with held-out splits, client_sample 3: every evaluation scores the same 3 clients (drawn from the
    seed), client/acc_mean is their mean accuracy (each equal to the full evaluation's for that client),
    client/acc_mean_se the sample's standard error (population 8), client/evaluated 3; with client_sample None (or at
    least 8) every client is scored and neither is logged."""
    from lfed.core.algorithm import LocalTraining
    from lfed.core.fit import fit_run
    from lfed.core.settings import Engine, Evaluation, build_run
    from lfed.data.datasets import load_dataset
    from lfed.engine.ranks import Ranks
    from lfed.evaluation.scores import client_evaluation, sample_mean_se

    ds = load_dataset("digits")

    def data():
        return FederatedDataModule.from_tensors(ds.train_x, ds.train_y, ds.test_x, ds.test_y, num_clients=8,
                                                partition="dirichlet", rho=0.5, seed=0, holdout_fraction=0.2)

    def run(sample):
        torch.manual_seed(0)
        r = build_run(net=nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), fraction=0.5, engine=Engine(backend=backend),
                      training=LocalTraining(client_lr=0.1, batch_size=16, local_steps=2),
                      evaluation=Evaluation(client_sample=sample, round_local_accuracy=False))
        fit_run(r, data(), 2)
        return r

    sampled = run(3)
    ids = sampled.client_sample_ids()
    assert ids.numel() == 3 and ids is sampled.client_sample_ids() and torch.equal(ids, ids.sort().values)
    metrics, per_client = sampled.evaluate(Ranks(), lambda t: t)
    full = client_evaluation(sampled.net, sampled.data, 0, 1, lambda t: t, nll=False)[0]
    torch.testing.assert_close(per_client[ids], full[ids], atol=0, rtol=0)
    assert int((~torch.isnan(per_client)).sum()) == 3
    assert metrics["client/acc_mean"] == pytest.approx(float(full[ids].mean()), abs=1e-12)
    assert metrics["client/acc_mean_se"] == sample_mean_se(full[ids], 8) and metrics["client/evaluated"] == 3.0
    again = run(3)
    assert torch.equal(again.client_sample_ids(), ids)  # seeded: the same clients
    for everyone in (None, 8):
        metrics, per_client = run(everyone).evaluate(Ranks(), lambda t: t)
        assert int((~torch.isnan(per_client)).sum()) == 8 and "client/acc_mean_se" not in metrics
    with pytest.raises(ValueError, match=r"^evaluation.client_sample: need an integer >= 1 or None \(every client\), got 0$"):
        Evaluation(client_sample=0)
