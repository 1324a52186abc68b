"""The functional round (lfed.core.round.run_round) without a Trainer: a fixed cohort and fixed step
counts in, the new weights, the components' state and the round's record out, checked by hand.

The toy regression of tests/client/test_objectives.py (P = 2, three clients of 2, 3 and 4
examples, full-batch steps, float64), with plain clients and IGFL-S time attention
(SPEC §4, ``time_weights: softmax``): round 0 has zero queries (the plain mean), round 1
weighs each client by the softmax over the cohort of ``<Δ_j^0, Δ_j^1>``.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_objectives import BACKENDS, W_INIT, grad, squared_loss, toy_data
from torch import nn

from lfed.core import registry as algorithms
from lfed.core.algorithm import LocalTraining, setup_state
from lfed.core.round import run_round
from lfed.engine import CohortTrainer
from lfed.state.spec import ModuleStateStore

TOL = dict(atol=1e-13, rtol=0)


def _setup(backend, algorithm="igfl_s_time", **explicit):
    net = nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        net.weight.copy_(W_INIT[None])
    alg = algorithms.build(algorithms.resolve(algorithm, **explicit))
    data = toy_data().build()
    store = ModuleStateStore()
    setup_state(alg, store, data.client_sizes, 2, W_INIT)
    return alg, store, data, CohortTrainer(net, squared_loss, backend)


def _local(w, k, steps, lr):
    y = w.clone()
    for _ in range(steps):
        y = y - lr * grad(y, k)
    return y - w


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fixed_cohort_and_fixed_steps_give_the_hand_record(backend):
    alg, store, data, engine = _setup(backend)
    plan = LocalTraining(client_lr=0.1, batch_size=None, local_steps=2)
    w0 = W_INIT.clone()

    w1, rec = run_round(alg, w0, data, plan, engine, round=0, clients=torch.tensor([0, 2]), steps_done=torch.tensor([2, 1]))
    d0 = {0: _local(w0, 0, 2, 0.1), 2: _local(w0, 2, 1, 0.1)}
    torch.testing.assert_close(w1, w0 + (d0[0] + d0[2]) / 2, **TOL)  # zero queries: the plain mean
    assert rec.cohort.clients.tolist() == [0, 2] and rec.cohort.steps_done.tolist() == [2, 1]
    assert rec.cohort.step_budget.tolist() == [2, 2] and rec.cohort.counting.tolist() == [True, True]
    torch.testing.assert_close(rec.weights, torch.tensor([2 / 6, 4 / 6], dtype=torch.float64), **TOL)  # size weights
    torch.testing.assert_close(rec.attention.matrix, torch.tensor([[0.5, 0.5]], dtype=torch.float64), **TOL)
    assert float(rec.attention.entropy) == pytest.approx(math.log(2), abs=1e-14)
    assert float(rec.attention.logit_spread) == 0.0
    norms = (d0[0] @ d0[0] + d0[2] @ d0[2]) / 2
    assert float(rec.attention.mean_sq_norm) == pytest.approx(float(norms), abs=1e-14)
    assert (rec.bits_up, rec.bits_down, rec.uploads, rec.skipped) == (2 * 64, 2 * 64, 2, False)  # 32 bits x P = 2
    metrics = rec.metrics()
    assert metrics["round/clients"] == 2 and metrics["attention/entropy"] == pytest.approx(math.log(2))
    torch.testing.assert_close(alg.history.state("previous_update")[[0, 2]], torch.stack([d0[0], d0[2]]), **TOL)
    assert alg.history.state("previous_update")[1].abs().sum() == 0  # client 1 was not in the cohort

    # round 1: clients 0 and 2 again, each with its round-0 update as query
    w2, rec = run_round(alg, w1, data, plan, engine, round=1, clients=torch.tensor([0, 2]), steps_done=torch.tensor([1, 2]))
    d1 = {0: _local(w1, 0, 1, 0.1), 2: _local(w1, 2, 2, 0.1)}
    own = torch.stack([d0[0] @ d1[0], d0[2] @ d1[2]])
    alpha = torch.softmax(own, 0)
    torch.testing.assert_close(w2, w1 + alpha[0] * d1[0] + alpha[1] * d1[2], **TOL)
    torch.testing.assert_close(rec.attention.weights, alpha, **TOL)
    assert float(rec.attention.logit_spread) == pytest.approx(float((own[0] - own[1]).abs()), abs=1e-14)
    torch.testing.assert_close(alg.history.state("global_change"), w2 - w1, **TOL)


def test_a_round_where_no_work_counts_changes_nothing():
    alg, store, data, engine = _setup("vmap", algorithm="scaffold")
    plan = LocalTraining(client_lr=0.1, batch_size=None, local_steps=2)
    assert store.describe() == {"objective.client_control": [3, 2], "objective.control": [2]}
    control = alg.objective.state("client_control").clone()
    w, rec = run_round(alg, W_INIT, data, plan, engine, clients=torch.tensor([1, 2]), steps_done=torch.tensor([0, 0]))
    assert w is W_INIT and rec.skipped and rec.uploads == 0 and rec.bits_up == 0 and rec.bits_down == 2 * 64
    assert torch.equal(alg.objective.state("client_control"), control) and alg.objective.state("control").abs().sum() == 0


def test_the_sampler_and_straggler_model_draw_when_nothing_is_given():
    alg, store, data, engine = _setup("loop", algorithm="fedavg", fraction=2 / 3)
    plan = LocalTraining(client_lr=0.1, batch_size=None, local_steps=2)
    _, rec = run_round(alg, W_INIT, data, plan, engine, round=3, seed=7)
    assert rec.cohort.clients.numel() == 2 and rec.cohort.steps_done.tolist() == [2, 2]
    _, again = run_round(alg, W_INIT, data, plan, engine, round=3, seed=7)
    assert torch.equal(rec.cohort.clients, again.cohort.clients)  # (seed, round) fixes the draw


def test_a_round_and_a_run_import_no_lightning():
    """The round as a function (lfed.core.round) and a run without a driver (lfed.core.run) load no Lightning."""
    import subprocess
    import sys

    code = "import sys, lfed.core.round, lfed.core.run; print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightning'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_a_cohort_whose_device_copy_drifted_from_its_host_copy_is_caught_in_the_rounds_one_read():
    """Issue 50: a device copy of the cohort's sizes off by one from the host copy (which Per-FedAvg, FedRoD and the
    step counts read) moved only their numbers and no test saw it. verify_round reads the agreement with the round's
    other flags (no extra device read) and raises naming the copies; equal copies pass."""
    from lfed.base.component import Cohort
    from lfed.core.record import RoundRecord, verify_round

    def record(shift: int) -> RoundRecord:
        c = Cohort(0, torch.tensor([1, 4]), torch.tensor([5, 7]), torch.tensor([2, 2]), torch.tensor([2, 2]), 6)
        c.counting = torch.tensor([True, True])
        c.host_values()
        c.num_examples = c.num_examples + torch.tensor([0, shift])
        return RoundRecord(0, c, torch.full((2,), 0.5, dtype=torch.float64))

    assert verify_round(record(0), {"x": torch.tensor(1.0)}) == {"x": 1.0}
    with pytest.raises(RuntimeError, match="device and host copies .* disagree"):
        verify_round(record(1), {"x": torch.tensor(1.0)})


def test_local_steps_with_local_epochs_is_refused_not_ignored():
    """A fixed budget of steps replaces the epochs: both given, one would be silently ignored (issue 51)."""
    with pytest.raises(ValueError, match="local_epochs: 2 would be ignored, because local_steps: 5"):
        LocalTraining(local_epochs=2, local_steps=5)
    assert LocalTraining(local_steps=5).step_budget(torch.tensor([7])).tolist() == [5]  # the default epochs: no conflict


# ---- bmta_local over the counting participants only (issue 67): a 2-class linear softmax model on three clients
CLS_X = torch.tensor([[1.0, 0.5], [-0.5, 1.0], [0.8, -1.0], [-1.0, -0.3], [0.2, 1.5], [1.2, 0.4], [-0.7, 0.9],
                      [1.0, -0.2], [-0.6, 0.8], [0.3, 1.1], [-1.2, 0.1], [0.9, 0.9], [0.5, -0.7], [-0.4, -1.0]],
                     dtype=torch.float64)
CLS_Y = torch.tensor([0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 0, 0, 1])
CLS_TRAIN = [[0, 1], [2, 3, 4], [5, 6]]  # rows each client trains on
CLS_HELD = [[7, 8], [9, 10, 11], [12, 13]]  # each client's own held-out split
CLS_W0 = torch.tensor([[0.1, 0.6], [0.4, -0.5]], dtype=torch.float64)  # [classes, features]


def _cls_data():
    from lfed.data.federated import FederatedData

    def padded(rows):
        width = max(map(len, rows))
        return torch.tensor([r + [r[0]] * (width - len(r)) for r in rows])

    counts = torch.stack([torch.bincount(CLS_Y[r], minlength=2) for r in CLS_TRAIN])
    return FederatedData(CLS_X, CLS_Y, CLS_X, CLS_Y, padded(CLS_TRAIN), torch.tensor([2, 3, 2]), padded(CLS_HELD),
                         torch.tensor([2, 3, 2]), counts, 2)


def _softmax_local(W, k, steps, lr):
    """Full-batch cross-entropy steps: ``W <- W - η (softmax(X Wᵀ) - onehot(y))ᵀ X / n_k``."""
    x, onehot = CLS_X[CLS_TRAIN[k]], nn.functional.one_hot(CLS_Y[CLS_TRAIN[k]], 2).double()
    for _ in range(steps):
        W = W - lr * (torch.softmax(x @ W.T, 1) - onehot).T @ x / len(CLS_TRAIN[k])
    return W


def _held_out_accuracy(W, k):
    x, y = CLS_X[CLS_HELD[k]], CLS_Y[CLS_HELD[k]]
    return float(((x @ W.T).argmax(1) == y).double().mean())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("partial_work, steps, counting", [("keep", [3, 0, 3], [0, 2]), ("drop", [3, 0, 2], [0])])
def test_bmta_local_is_the_mean_over_the_counting_participants_not_the_inactive(backend, partial_work, steps, counting):
    """Issue 67 (docs/algorithms.md §9, lfed/core/synchronous.py): client/local_acc_mean and bmta_local are the mean
    of each counting participant's w_k_end on its own held-out split. Client 1 is sampled but inactive (0 steps): it
    is left out (its w_k_end is the global model, which scores 1/3 there; counted, the mean would move). With
    ``partial_work: drop`` the straggler client 2 (2 of 3 steps, active) is left out too. The round's halves as run_round
    runs them (prepare_round, the engine), finished as a training step finishes it (lfed.core.step.finish_step: the
    synchronous schedule's arrivals and metrics), on a fixed cohort."""
    from lfed.core.round import prepare_round, train_prepared
    from lfed.core.run import FederatedRun
    from lfed.core.settings import Engine
    from lfed.core.step import finish_step
    from lfed.engine.ranks import Ranks

    net = nn.Linear(2, 2, bias=False).double()
    with torch.no_grad():
        net.weight.copy_(CLS_W0)
    lr, T = 0.5, 3
    alg = algorithms.build(algorithms.resolve("fedavg", fraction=1.0, partial_work=partial_work))
    plan = LocalTraining(client_lr=lr, batch_size=None, local_steps=T)
    run = FederatedRun(alg, plan, lambda p: torch.optim.SGD(p, lr=1.0), net=net, engine=Engine(backend=backend))
    data = _cls_data()
    run.setup(data)
    run.start(data, 1)
    prepared = prepare_round(run.components, run.layout.module_vector(run.net), data, plan, run.engine, round=0,
                             clients=torch.tensor([0, 1, 2]), steps_done=torch.tensor(steps), sizes=run.layout.sizes)
    assert prepared.record.cohort.counting.tolist() == [k in counting for k in range(3)]
    result = train_prepared(run.engine, Ranks(), prepared)
    metrics, _ = finish_step(run, prepared, result, torch.optim.SGD(run.net.parameters(), lr=1.0), Ranks())

    # by hand: client 0 (3 steps) scores 1 on its 2 held-out examples; client 2 scores 1 after 3 steps, 1/2 after
    # 2; client 1 (inactive: the global model) 1/3 of 3
    acc = {k: _held_out_accuracy(_softmax_local(CLS_W0, k, s, lr), k) for k, s in zip(range(3), steps)}
    assert acc == {0: 1.0, 1: 1 / 3, 2: 1.0 if steps[2] == T else 0.5}
    want = sum(acc[k] for k in counting) / len(counting)  # 1 in both cases; with the inactive client 7/9 (keep),
    assert want == 1.0  # 11/18 (drop); with the dropped straggler but not the inactive client 3/4 (drop)
    assert metrics["client/local_acc_mean"] == pytest.approx(want, abs=1e-15)
    assert run.bmta.summary()["final/bmta_local"] == pytest.approx(want, abs=1e-15)


class _CountingSums(torch.Tensor):
    """A tensor that counts the sums taken over all of its ``rows`` rows (the population's table; a cohort's rows,
    indexed from it, have fewer)."""

    sums, rows = 0, 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.sum, torch.sum) and args and args[0].dim() == 2 and args[0].shape[0] == cls.rows:
            cls.sums += 1
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_populations_label_counts_are_summed_once_not_every_round(backend):
    """DWFed reads the population's label counts Σ_k c_k ([C]); they never change during a run, so a round reads them
    in O(C) from FederatedData.population_label_counts (summed once), not O(N C) from the [N, C] table (0.5 summed them
    every round, ~60% of a round at N = 10^7, issue 65). Three rounds through run_round sum the table once, and the
    weights are DWFed's of those counts."""
    from lfed.data.datasets import load_dataset
    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.server.weight_formulas import aggregation_weights

    ds = load_dataset("digits")
    data = FederatedDataModule.from_tensors(ds.train_x, ds.train_y, ds.test_x, ds.test_y, num_clients=8,
                                            partition="dirichlet", rho=0.5, seed=0).build()
    counts = data.host("label_counts")
    data.__dict__["_host"]["label_counts"] = counts.as_subclass(_CountingSums)
    _CountingSums.sums, _CountingSums.rows = 0, 8
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    alg = algorithms.build(algorithms.resolve("fedavg", weighting="dwfed"))
    engine = CohortTrainer(net, backend=backend)
    w = engine.layout.module_vector(net)
    setup_state(alg, ModuleStateStore(), data.client_sizes, w.numel(), w)
    plan = LocalTraining(client_lr=0.1, batch_size=16, local_steps=1)
    for r in range(3):
        w, rec = run_round(alg, w, data, plan, engine, round=r, clients=torch.tensor([1, 4, 6]),
                           steps_done=torch.tensor([1, 1, 1]))
    assert _CountingSums.sums == 1
    population = data.population_label_counts()
    assert population is data.population_label_counts() and torch.equal(population, counts.sum(0))
    host = rec.cohort.host
    want = aggregation_weights("dwfed", num_examples=host.num_examples, steps_done=host.steps_done,
                               step_budget=host.step_budget, client_label_counts=counts[[1, 4, 6]],
                               population_label_counts=counts.sum(0))
    torch.testing.assert_close(rec.weights.cpu().double(), want.double(), atol=0, rtol=1e-6)  # (the round's in float32)
