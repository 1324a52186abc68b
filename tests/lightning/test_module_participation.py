"""Participation through FederatedModule (SPEC §3, §5, §6): AdaFL attention sampling with the
module's own distances, fraction schedules, stragglers as step masks, partial-work weighting,
communication accounting and the "rounds (uploads) to reach X%" summary, resume, bad input.

Every expected value is computed here by hand from the clients' data: local models are plain
full-batch gradient descent on a linear model (autograd on a fresh tensor, not lfed's engine).
"""

import pytest
import torch
from conftest import REPO, flat_weights, run_rounds
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import Logger
from torch import nn

from lfed.lightning.cli import run_cli
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.participation.sampling import AttentionSampler, ConstantFraction, ExplicitFraction, StepwiseFraction, UniformSampler
from lfed.participation.stragglers import Stragglers
from lfed.participation.sum_tree import SumTree, weighted_draw
from lfed.rng import round_generator

D_IN, CLASSES = 3, 2


# --------------------------------------------------------------------------- helpers


def _toy_dm(n: int, clients: int, seed: int = 0) -> FederatedDataModule:
    """``n`` random float64 points, ``clients`` iid clients (the first ``n mod N`` get one more)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D_IN, generator=g, dtype=torch.float64)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return FederatedDataModule.from_tensors(
        x, y, x, y, num_clients=clients, partition="iid", holdout_fraction=0.0, num_classes=CLASSES
    )


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(D_IN, CLASSES).double()


def _client_data(dm: FederatedDataModule, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = dm.build()
    rows = d.client_index[k, : int(d.client_sizes[k])]
    return d.train_x[rows], d.train_y[rows]


def _local_gd(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> torch.Tensor:
    """``steps`` full-batch GD steps on mean cross-entropy of ``x @ W.T + b``, ``w = [W.flatten(), b]``."""
    w = w.clone()
    for _ in range(steps):
        W = w[: CLASSES * D_IN].view(CLASSES, D_IN).clone().requires_grad_(True)
        b = w[CLASSES * D_IN :].clone().requires_grad_(True)
        loss = nn.functional.cross_entropy(x @ W.T + b, y)
        gW, gb = torch.autograd.grad(loss, (W, b))
        w = w - lr * torch.cat([gW.flatten(), gb])
    return w


def _spy(obj, name: str, record: list, before=None) -> None:
    """Wrap ``obj.name`` so each call appends ``(before(), result)`` (or the result) to ``record``."""
    original = getattr(obj, name)

    def wrapper(*args, **kwargs):
        state = before() if before is not None else None
        out = original(*args, **kwargs)
        kept = tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in out) if isinstance(out, tuple) else out
        record.append(kept if before is None else (state, kept))  # as returned (a sampler's p may be a view)
        return out

    object.__setattr__(obj, name, wrapper)


def _record_cohorts(module: FederatedModule) -> list[list[int]]:
    cohorts: list[list[int]] = []
    original = module.sampler.sample

    def sample(*args, **kwargs):
        ids, p = original(*args, **kwargs)
        cohorts.append(ids.tolist())
        return ids, p

    object.__setattr__(module.sampler, "sample", sample)
    return cohorts


class _PerRound(Callback):
    """What the module logged after each round."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.rows.append({k: float(v) for k, v in trainer.callback_metrics.items()})


class _CaptureLogger(Logger):
    """A Lightning logger that keeps every ``log_metrics`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "capture"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((step, dict(metrics)))


BACKENDS = ["vmap", "loop"]


# --------------------------------------------------------------------------- AdaFL attention sampling


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_scores_over_two_rounds_by_hand_with_the_module_distances(backend):
    """003 Algorithm 1 through the module: 5 clients of sizes (3, 3, 3, 2, 2), K = 3 per round.

    ``a^(1) = n / 13 = (3, 3, 3, 2, 2) / 13``. Each round the three sampled clients take 2 full-batch
    GD steps from the global model (``w_i``), the server averages by size
    (``w' = Σ n_i w_i / Σ n_i``), and for the sampled ``i``:
    ``d_i = ||w' - w_i||``, ``a_i ← 0.9 a_i + 0.1 d_i / Σ d * Σ_S a``; the others keep theirs.
    (With K = 2 clients of equal size both distances are ``||w_1 - w_2|| / 2`` and nothing moves,
    hence three clients.)
    """
    dm = _toy_dm(n=13, clients=5)
    net = _net()
    w = torch.cat([net.weight.detach().flatten(), net.bias.detach()]).clone()
    module = FederatedModule(
        net, algorithm="adafl", fraction=0.6, sampler=AttentionSampler(alpha=0.9),
        training=dict(client_lr=0.5, batch_size=None, local_steps=2), engine=dict(backend=backend), seed=1,
    )
    draws: list = []
    _spy(module.sampler, "sample", draws, before=lambda: module.sampler.scores.clone())
    run_rounds(module, dm, rounds=2)

    sizes = dm.data.client_sizes
    assert sizes.tolist() == [3, 3, 3, 2, 2]
    a = sizes.double() / 13
    assert len(draws) == 2
    for r, (scores_before, (ids, p)) in enumerate(draws):
        # the module samples round r with the hand-computed scores ...
        assert torch.allclose(scores_before, a, atol=1e-14, rtol=0) and torch.equal(p, scores_before)
        # ... by successive draws proportional to them (the law of torch.multinomial without replacement; 0.6 draws
        # them through a sum tree of the scores, lfed.participation.sum_tree)
        expected_ids = weighted_draw(SumTree(a), 3, round_generator(1, r, "sample"))
        assert ids.tolist() == sorted(expected_ids.tolist())
        S = ids.tolist()
        local = {i: _local_gd(w, *_client_data(dm, i), steps=2, lr=0.5) for i in S}
        n_S = float(sizes[S].sum())
        w_next = sum(float(sizes[i]) / n_S * local[i] for i in S)
        d = torch.stack([(w_next - local[i]).norm() for i in S])
        new = a.clone()
        new[S] = 0.9 * a[S] + 0.1 * d / d.sum() * a[S].sum()
        assert abs(float(new.sum()) - 1.0) < 1e-14  # the scores stay a distribution
        others = [j for j in range(5) if j not in S]
        assert torch.equal(new[others], a[others])  # unsampled clients keep their score
        assert not torch.allclose(new[S], a[S])  # and the sampled ones did move
        a, w = new, w_next
    assert torch.allclose(module.sampler.scores, a, atol=1e-14, rtol=0)
    # the last round's unsampled clients keep, bit for bit, the scores the module gave them before it (those the
    # first round moved were computed there by the module's arithmetic, equal to the hand's to 1e-14 above)
    assert torch.equal(module.sampler.scores[others], draws[-1][0][others])
    assert abs(float(module.sampler.scores.sum()) - 1.0) < 1e-14
    assert torch.allclose(flat_weights(module), w, atol=1e-13, rtol=0)


# --------------------------------------------------------------------------- stragglers


@pytest.mark.parametrize("backend", BACKENDS)
def test_straggler_model_switched_off_changes_nothing(backend):
    """p_inactive = p_incomplete = 0: bit-identical to the plain run, whatever partial_work says."""
    runs = {}
    settings = {
        "plain": {},
        "keep": {"stragglers": {"p_inactive": 0.0, "p_incomplete": 0.0}, "partial_work": "keep"},
        "drop": {"stragglers": {"p_inactive": 0.0, "p_incomplete": 0.0}, "partial_work": "drop"},
        "scale": {"stragglers": {"p_inactive": 0.0, "p_incomplete": 0.0}, "partial_work": "scale"},
    }
    for name, kwargs in settings.items():
        module = FederatedModule(
            _net(), fraction=0.6, training=dict(client_lr=0.3, batch_size=2, local_epochs=2), engine=dict(backend=backend), seed=5,
            **kwargs,
        )
        steps: list = []
        _spy(module.participation.stragglers, "draw", steps)
        cohorts = _record_cohorts(module)
        run_rounds(module, _toy_dm(n=20, clients=5), rounds=3)
        budgets = [s.tolist() for s in steps]
        runs[name] = (flat_weights(module).clone(), cohorts, budgets, module.comm.uploads)
    plain = runs["plain"]
    assert plain[3] == 9  # 3 rounds of round_half_up(0.6 * 5) = 3 clients
    assert all(b == [4, 4, 4] for b in plain[2])  # everyone completes E * ceil(4 / 2) = 4 steps
    for name in ("keep", "drop", "scale"):
        assert torch.equal(runs[name][0], plain[0]), name
        assert runs[name][1:] == plain[1:], name


# One round, 3 clients of sizes (4, 3, 3), all sampled, budget T = 4 full-batch steps each.
# With p_inactive = p_incomplete = 1/3, seed 49 draws s = (4, 2, 0) in round 0 (asserted below).
STRAGGLER_SEED, STRAGGLER_STEPS = 49, [4, 2, 0]


def _straggler_run(partial_work: str, backend: str, callbacks=()):
    dm = _toy_dm(n=10, clients=3)
    net = _net(seed=3)
    w0 = torch.cat([net.weight.detach().flatten(), net.bias.detach()]).clone()
    module = FederatedModule(
        net, fraction=1.0, training=dict(client_lr=0.4, batch_size=None, local_steps=4), engine=dict(backend=backend),
        seed=STRAGGLER_SEED, stragglers=dict(p_inactive=1 / 3, p_incomplete=1 / 3), partial_work=partial_work,
    )
    steps: list = []
    _spy(module.participation.stragglers, "draw", steps)
    run_rounds(module, dm, rounds=1, callbacks=list(callbacks))
    assert [s.tolist() for s in steps] == [STRAGGLER_STEPS]
    return module, dm, w0


@pytest.mark.parametrize("backend", BACKENDS)
def test_partial_work_keep_scale_drop_final_weights_by_hand(backend):
    """SPEC §3 with s = (4, 2, 0), T = 4, n = (4, 3, 3), size weights over the active clients:

    * keep (FedProx): a = (4/7, 3/7, 0)
    * scale (EFL, 004 §4.2): a = (4/7, 3/7 * 4/2, 0) = (4/7, 6/7, 0), not renormalised (sum 10/7)
    * drop (FedAvg): only complete clients, renormalised: a = (1, 0, 0)

    and ``w = w0 + Σ a_k (w_k - w0)`` with ``w_k`` client k's model after its ``s_k`` steps.
    """
    expected_weights = {"keep": [4 / 7, 3 / 7, 0.0], "scale": [4 / 7, 6 / 7, 0.0], "drop": [1.0, 0.0, 0.0]}
    finals = {}
    for partial_work, a in expected_weights.items():
        module, dm, w0 = _straggler_run(partial_work, backend)
        local = [_local_gd(w0, *_client_data(dm, k), steps=s, lr=0.4) for k, s in enumerate(STRAGGLER_STEPS)]
        assert torch.equal(local[2], w0)  # the inactive client did nothing
        expected = w0 + sum(a_k * (w_k - w0) for a_k, w_k in zip(a, local))
        finals[partial_work] = flat_weights(module).clone()
        assert torch.allclose(finals[partial_work], expected, atol=1e-13, rtol=0), partial_work
        # uploads count the clients whose work counts: the inactive one never uploads, drop ignores client 1
        assert module.comm.uploads == (1 if partial_work == "drop" else 2)
        assert module.trainer.callback_metrics["round/weight_sum"] == pytest.approx(sum(a), abs=1e-12)
    # the three treatments really differ (by far more than round-off)
    for x, y in (("keep", "scale"), ("keep", "drop"), ("scale", "drop")):
        assert float((finals[x] - finals[y]).norm()) > 1e-3, (x, y)


class _CountWork(Callback):
    """Counts the model's forward passes and, for vmap, the rows of each vmapped step."""

    def __init__(self) -> None:
        self.forwards = 0
        self.vmap_rows: list[int] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        pl_module.net.register_forward_hook(lambda *args: setattr(self, "forwards", self.forwards + 1))
        engine = pl_module.engine
        original = engine._vmapped

        def counted(params, *args):  # params: {name: [rows, *shape]} (or a flat [rows, P])
            first = next(iter(params.values())) if isinstance(params, dict) else params
            self.vmap_rows.append(int(first.shape[0]))
            return original(params, *args)

        engine._vmapped = counted


@pytest.mark.parametrize("backend", BACKENDS)
def test_steps_not_done_cost_no_compute(backend):
    """s = (4, 2, 0): the loop backend runs 4 + 2 + 0 = 6 client steps; vmap runs 4 batched
    steps over the clients still working: 2, 2, 1, 1 rows."""
    counter = _CountWork()
    _straggler_run("keep", backend, callbacks=[counter])
    if backend == "loop":
        assert counter.forwards == 6 and counter.vmap_rows == []
    else:
        assert counter.forwards == 4 and counter.vmap_rows == [2, 2, 1, 1]


@pytest.mark.parametrize("partial_work", ["keep", "drop"])
def test_attention_scores_move_only_for_clients_whose_upload_counts(partial_work):
    """With stragglers an inactive (or dropped) client sent no model, so it has no distance and
    keeps its AdaFL score. s = (4, 2, 0), n = (4, 3, 3), a = n / 10.

    * keep: clients 0 and 1 count with weights (4/7, 3/7): ``w' = (4 w_0 + 3 w_1) / 7``,
      ``d_i = ||w' - w_i||`` and ``a_i ← 0.9 a_i + 0.1 d_i / (d_0 + d_1) (a_0 + a_1)`` for i = 0, 1.
    * drop: only client 0 counts, its share is 1: ``a_0 ← 0.9 a_0 + 0.1 a_0``; 1 and 2 keep theirs.
    """
    dm = _toy_dm(n=10, clients=3)
    net = _net(seed=3)
    w0 = torch.cat([net.weight.detach().flatten(), net.bias.detach()]).clone()
    module = FederatedModule(
        net, algorithm="adafl", fraction=1.0, training=dict(client_lr=0.4, batch_size=None, local_steps=4),
        seed=STRAGGLER_SEED, stragglers=dict(p_inactive=1 / 3, p_incomplete=1 / 3), partial_work=partial_work,
    )
    steps: list = []
    _spy(module.participation.stragglers, "draw", steps)
    run_rounds(module, dm, rounds=1)
    assert [s.tolist() for s in steps] == [STRAGGLER_STEPS]
    a = torch.tensor([4, 3, 3], dtype=torch.float64) / 10
    expected = a.clone()
    if partial_work == "keep":
        w_0, w_1 = (_local_gd(w0, *_client_data(dm, k), steps=s, lr=0.4) for k, s in ((0, 4), (1, 2)))
        w_next = 4 / 7 * w_0 + 3 / 7 * w_1
        d = torch.stack([(w_next - w_0).norm(), (w_next - w_1).norm()])
        expected[:2] = 0.9 * a[:2] + 0.1 * d / d.sum() * a[:2].sum()
        assert not torch.allclose(expected[:2], a[:2])
    else:
        expected[0] = 0.9 * a[0] + 0.1 * a[0]
    scores = module.sampler.scores
    assert torch.allclose(scores, expected, atol=1e-15, rtol=0)
    untouched = [2] if partial_work == "keep" else [1, 2]
    assert torch.equal(scores[untouched], a[untouched])


# --------------------------------------------------------------------------- fraction schedules


SCHEDULES = [
    (0.25, [2] * 8),
    (StepwiseFraction(0.25, 1.0, stages=4), [2, 2, 4, 4, 6, 6, 8, 8]),
    (ExplicitFraction([(0, 0.125), (3, 0.5), (6, 0.75)]), [1, 1, 1, 4, 4, 4, 6, 6]),
]


@pytest.mark.parametrize("sampler", ["uniform", "attention"])
@pytest.mark.parametrize("fraction,sizes", SCHEDULES, ids=["constant", "stepwise", "explicit"])
def test_fraction_schedule_cohort_sizes_as_the_module_logs_them(sampler, fraction, sizes):
    """N = 8, 8 rounds. Stepwise 0.25 -> 1.0 in 4 stages of 2 rounds: γ = 0.25, 0.5, 0.75, 1.0,
    K = 2, 4, 6, 8. Explicit [(0, 1/8), (3, 1/2), (6, 3/4)]: K = 1, 1, 1, 4, 4, 4, 6, 6."""
    module = FederatedModule(_net(), sampler=sampler, fraction=fraction, training=dict(client_lr=0.1, batch_size=None, local_steps=1))
    cohorts = _record_cohorts(module)
    log = _PerRound()
    run_rounds(module, _toy_dm(n=16, clients=8), rounds=8, callbacks=[log])
    assert [len(c) for c in cohorts] == sizes
    assert all(len(set(c)) == len(c) for c in cohorts)
    assert [row["round/clients"] for row in log.rows] == sizes
    assert [row["comm/uploads"] for row in log.rows] == sizes
    running = [sum(sizes[: i + 1]) for i in range(8)]
    assert [row["comm/uploads_total"] for row in log.rows] == running
    # bits: dense float32 updates of 3 * 2 + 2 = 8 parameters, 32 bits each, up and down
    assert [row["comm/bits_up_total"] for row in log.rows] == [256.0 * u for u in running]
    assert [row["comm/bits_down"] for row in log.rows] == [256.0 * k for k in sizes]
    assert module.comm.uploads == running[-1] and module.comm.rounds == 8


def _adafl_with_stragglers(seed: int, **kwargs) -> FederatedModule:
    return FederatedModule(
        _net(), algorithm="adafl", fraction=ExplicitFraction([(0, 0.25), (3, 0.5)]), training=dict(client_lr=0.2, batch_size=2, local_epochs=1),
        stragglers=dict(p_inactive=0.2, p_incomplete=0.3), seed=seed, **kwargs,
    )


def test_same_seed_same_cohorts_other_seed_other_cohorts():
    def run(module):
        cohorts = _record_cohorts(module)
        steps: list = []
        _spy(module.participation.stragglers, "draw", steps)
        run_rounds(module, _toy_dm(n=24, clients=8), rounds=6)
        return cohorts, [s.tolist() for s in steps], flat_weights(module).clone()

    first, again, other = run(_adafl_with_stragglers(3)), run(_adafl_with_stragglers(3)), run(_adafl_with_stragglers(4))
    assert first[0] == again[0] and first[1] == again[1] and torch.equal(first[2], again[2])
    assert first[0] != other[0]
    assert [len(c) for c in first[0]] == [2, 2, 2, 4, 4, 4]
    # the straggler stream is separate from the sampling stream: switching stragglers off keeps
    # the (uniform) cohorts of every round
    with_stragglers = FederatedModule(_net(), fraction=0.5, stragglers=dict(p_inactive=0.3, p_incomplete=0.3), seed=3,
                                      training=dict(batch_size=2))
    without = FederatedModule(_net(), fraction=0.5, seed=3, training=dict(batch_size=2))
    assert run(with_stragglers)[0] == run(without)[0]


def test_resumed_run_samples_the_same_clients(tmp_path):
    """AdaFL scores ride in the checkpoint: rounds 3-5 after a resume are rounds 3-5 of the
    uninterrupted run (cohorts, straggler draws, scores, weights, uploads)."""

    def trainer(rounds, **kwargs):
        return Trainer(
            max_steps=rounds, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
            precision="64-true", check_val_every_n_epoch=None, val_check_interval=rounds, limit_val_batches=0, **kwargs,
        )

    full = _adafl_with_stragglers(7)
    full_cohorts = _record_cohorts(full)
    trainer(6).fit(full, datamodule=_toy_dm(n=24, clients=8))

    class StopAfter3(Callback):  # an interrupted run: same max_steps, stopped after round 3
        def on_train_batch_end(self, trainer, *args) -> None:
            trainer.should_stop = trainer.global_step >= 3

    first = _adafl_with_stragglers(7)
    t = trainer(6, callbacks=[StopAfter3()])
    t.fit(first, datamodule=_toy_dm(n=24, clients=8))
    assert t.global_step == 3
    path = tmp_path / "round3.ckpt"
    t.save_checkpoint(path)

    resumed = _adafl_with_stragglers(7)
    resumed_cohorts = _record_cohorts(resumed)
    trainer(6).fit(resumed, datamodule=_toy_dm(n=24, clients=8), ckpt_path=path)
    assert resumed_cohorts == full_cohorts[3:]
    assert torch.equal(resumed.sampler.scores, full.sampler.scores)
    assert torch.equal(flat_weights(resumed), flat_weights(full))
    assert resumed.comm.uploads == full.comm.uploads and resumed.comm.rounds == 6


# --------------------------------------------------------------------------- accounting and summary


def test_rounds_and_uploads_to_reach_targets_are_logged_at_the_end():
    """Stepwise 0.25 -> 1.0 over 8 rounds of 8 clients, evaluation every 2 rounds:
    evaluations after 2, 4, 6, 8 rounds with 2+2, +4+4, +6+6, +8+8 = 4, 12, 24, 40 uploads."""
    module = FederatedModule(
        _net(), algorithm="adafl", fraction=StepwiseFraction(0.25, 1.0, stages=4),
        training=dict(client_lr=0.5, batch_size=None, local_steps=3), evaluation=dict(accuracy_targets=[0.0, 0.75, 1.0]),
    )
    logger = _CaptureLogger()
    trainer = Trainer(
        max_steps=8, accelerator="cpu", devices=1, logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        precision="64-true", check_val_every_n_epoch=None, val_check_interval=2, log_every_n_steps=1,
    )
    trainer.fit(module, datamodule=_toy_dm(n=64, clients=8))
    history = module.comm.history
    assert [(r, u) for r, u, _ in history] == [(2, 4), (4, 12), (6, 24), (8, 40)]
    accs = [acc for _, _, acc in history]
    assert max(accs) >= 0.75, accs  # the target in the middle is reached in this run ...
    first = next(i for i, acc in enumerate(accs) if acc >= 0.75)
    summary = trainer.logger.calls[-1][1]
    assert summary["final/rounds_to_0"] == 2 and summary["final/uploads_to_0"] == 4
    assert summary["final/rounds_to_0.75"] == history[first][0]
    assert summary["final/uploads_to_0.75"] == history[first][1]
    if max(accs) < 1.0:  # ... and an unreached target is left out, not reported as reached
        assert "final/rounds_to_1" not in summary and "final/uploads_to_1" not in summary
    assert summary["final/uploads_total"] == 40
    assert module.final_summary == summary


# --------------------------------------------------------------------------- configs through the CLI


def _cli(tmp_path, *args):
    return run_cli(
        [
            "fit", "--config", str(REPO / "configs/adafl_digits.yaml"),
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger", "false", "--trainer.enable_checkpointing", "false", *args,
        ]
    )


@pytest.mark.parametrize(
    "fraction,kind,uploads",
    [
        # the config's own StepwiseFraction(0.1, 0.5, 5) over 5 rounds of 50 clients: 5+10+15+20+25
        (None, StepwiseFraction, 75),
        ("0.2", ConstantFraction, 50),
        ('{"class_path": "lfed.participation.sampling.ExplicitFraction", "init_args": {"points": [[0, 0.04], [3, 0.5]]}}',
         ExplicitFraction, 2 + 2 + 2 + 25 + 25),
    ],
    ids=["yaml-stepwise", "float", "explicit-arg"],
)
def test_fraction_from_yaml_and_command_line(tmp_path, fraction, kind, uploads):
    extra = [] if fraction is None else ["--model.fraction", fraction]
    cli = _cli(tmp_path, "--trainer.max_steps", "5", "--trainer.val_check_interval", "5", "--model.training.local_steps", "1", *extra)
    assert isinstance(cli.model.participation.fraction, kind)
    assert isinstance(cli.model.sampler, AttentionSampler) and cli.model.sampler.alpha == 0.9
    assert cli.model.comm.uploads == uploads
    assert cli.trainer.global_step == 5


def test_decreasing_schedule_from_the_command_line_is_refused_with_the_reason(tmp_path, capsys):
    bad = '{"class_path": "lfed.participation.sampling.StepwiseFraction", "init_args": {"start": 0.5, "end": 0.1}}'
    with pytest.raises((ValueError, SystemExit)) as info:  # jsonargparse raises or exits, by version
        _cli(tmp_path, "--trainer.max_steps", "1", "--model.fraction", bad)
    message = str(info.value) + capsys.readouterr().err
    assert "end must be >= start (the fraction schedule must be non-decreasing), got start=0.5, end=0.1" in message


def test_paper_config_is_adafl_on_mnist(tmp_path, data_dir):
    """configs/paper/adafl_mnist.yaml: 100 clients, 2 shards each, MLP 2NN, α = 0.9, 200-round
    stages 0.1 -> 0.5 (003's upload counts: 423 rounds = 200*10 + 200*20 + 23*30 = 6690)."""
    cli = run_cli(
        [
            "fit", "--config", str(REPO / "configs/paper/adafl_mnist.yaml"), "--data.data_dir", str(data_dir),
            "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--model.training.local_steps", "2",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
        ]
    )
    m = cli.model
    assert isinstance(m.sampler, AttentionSampler) and m.sampler.alpha == 0.9
    assert m.composition["weighting"] == "size" and m.objective.name == "plain" and m.composition["combination"] == "mean"
    assert [m.participation.fraction(r, 1000) for r in (0, 199, 200, 423, 800, 2000)] == [0.1, 0.1, 0.2, 0.3, 0.5, 0.5]
    counts = [round(m.participation.fraction(r, None) * 100) for r in range(423)]
    assert sum(counts) == 6690 and sum(round(m.participation.fraction(r, None) * 100) for r in range(761)) == 18440
    assert cli.datamodule.num_clients == 100 and cli.datamodule.partition == "shards"
    assert m.comm.uploads == 20  # 2 rounds of 10 clients
    assert m.accuracy_targets == [0.9, 0.91]


@pytest.mark.parametrize("preset,objective", [("adafl", "plain"), ("adafl_scaffold", "scaffold"), ("adafl_fedprox", "prox")])
def test_adafl_presets(preset, objective):
    m = FederatedModule(_net(), algorithm=preset)
    assert isinstance(m.sampler, AttentionSampler) and m.sampler.alpha == 0.9
    assert isinstance(m.participation.fraction, StepwiseFraction)
    assert (m.participation.fraction.start, m.participation.fraction.end, m.participation.fraction.stages) == (0.1, 0.5, 5)
    assert m.objective.name == objective and m.composition["combination"] == "mean" and m.composition["channel"] is None
    # any sampler takes any schedule: the preset's pieces can be swapped one by one
    assert isinstance(FederatedModule(_net(), algorithm=preset, sampler="uniform").sampler, UniformSampler)
    assert isinstance(FederatedModule(_net(), algorithm=preset, fraction=0.3).participation.fraction, ConstantFraction)


# --------------------------------------------------------------------------- bad input


ATTENTION = "lfed.participation.sampling.AttentionSampler"  # the sampler as a config gives it: built by FederatedModule


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"fraction": 0.0}, r"fraction must be in \(0, 1\], got 0.0"),
        ({"fraction": -0.1}, r"fraction must be in \(0, 1\]"),
        ({"fraction": 1.01}, r"fraction must be in \(0, 1\]"),
        ({"fraction": float("nan")}, r"fraction must be in \(0, 1\]"),
        ({"fraction": "0.5"}, "fraction must be a number"),
        ({"algorithm": "adafl", "fraction": 2.0}, r"fraction must be in \(0, 1\]"),
        ({"algorithm": "adafl", "sampler": {"class_path": ATTENTION, "init_args": {"alpha": 1.0}}},
         r"alpha: must be a finite number in \[0, 1\) \(AdaFL's score decay α\)"),
        ({"algorithm": "adafl", "sampler": {"class_path": ATTENTION, "init_args": {"alpha": -0.1}}},
         r"alpha: must be a finite number in \[0, 1\) \(AdaFL's score decay α\)"),
        ({"sampler_alpha": 1.5}, "alpha: must be"),  # checked even while the uniform sampler ignores it (0.3's key)
        ({"stragglers": {"p_inactive": 0.6, "p_incomplete": 0.5}}, r"p_inactive \+ p_incomplete must be <= 1"),
        ({"stragglers": {"p_inactive": -0.1}}, r"p_inactive: must be a finite number in \[0, 1\] \(a probability\), got -0.1"),
        ({"stragglers": {"p_incomplete": 1.5}}, r"p_incomplete: must be a finite number in \[0, 1\] \(a probability\), got 1.5"),
        ({"partial_work": "sometimes"}, "partial_work"),
        ({"evaluation": {"accuracy_targets": [90]}}, r"accuracy_targets\[0\] must be an accuracy in \[0, 1\]"),
    ],
)
def test_bad_participation_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FederatedModule(_net(), **kwargs)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: StepwiseFraction(0.5, 0.1), "non-decreasing"),
        (lambda: StepwiseFraction(0.1, 1.5), r"end must be in \(0, 1\]"),
        (lambda: StepwiseFraction(0.0, 0.5), r"start must be in \(0, 1\]"),
        (lambda: ExplicitFraction([(0, 0.5), (10, 0.2)]), "non-decreasing"),
        (lambda: ExplicitFraction([(0, 0.1), (10, 1.2)]), r"fraction must be in \(0, 1\]"),
        (lambda: Stragglers(0.7, 0.4), r"p_inactive \+ p_incomplete must be <= 1"),
        (lambda: AttentionSampler(1.0), r"\[0, 1\)"),
    ],
)
def test_bad_schedules_and_models_fail_before_reaching_the_module(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_only_the_stepwise_schedule_depends_on_the_run_length():
    """A resume or an extension with another max_steps changes only a stepwise schedule."""
    schedules = [ConstantFraction(0.3), StepwiseFraction(0.1, 0.5, 5), ExplicitFraction([(0, 0.1), (4, 0.5)])]
    for schedule in schedules:
        changes = any(schedule(r, 10) != schedule(r, 20) for r in range(20))
        assert schedule.depends_on_total_rounds == changes, schedule
    assert StepwiseFraction(0.1, 0.5, 5).depends_on_total_rounds
