"""One federated round as a function: components in, new weights and a record out (docs/algorithms.md §1).

:func:`run_round` needs no Trainer: give it the global weights ``w [P]``, an :class:`~lfed.core.algorithm.Algorithm`
(its components hold their declared state, :mod:`lfed.state.spec`), the federated data on the device, a
:class:`~lfed.core.algorithm.LocalTraining` and a :class:`~lfed.engine.CohortTrainer`; optionally a fixed cohort and
fixed step counts (otherwise the algorithm's sampler and straggler model draw them from ``seed``). It returns the new
global weights and a :class:`~lfed.core.record.RoundRecord` (cohort, steps, aggregation weights, attention and its
entropy and logit spread, losses, bits), and moves the components' state on. It is told in four steps, each a
function of this module, read top-down::

    prepared = prepare_round(...)     # the cohort (§5, §6), its weights (§3), the step rule (§2): the engine's job
    result   = train_prepared(...)    # local work, every client at once (lfed.engine)
    uploads  = client_uploads(...)    # objective.after_local, the local part kept, the attack's rows (§2, §13)
    w'       = server_update(...)     # channel up, combination (§4), channel down, server step (§4.1),
                                      # the components keep what they need (history, sampler.observe) and report

A run's training step (:func:`lfed.core.step.train_step`) is these same functions: a synchronous round calls them
in this order; an asynchronous server step (:mod:`lfed.core.asynchronous`) dispatches with :func:`prepare_round` and
steps the server on its arrivals with :func:`server_update`.

With partial sharing (docs/algorithms.md §13, :class:`lfed.personal.sharing.Sharing`, resolved by
:meth:`~lfed.core.algorithm.Algorithm.attach`) each client starts from the global shared part and its own local part
(``objective.start_weights``), and the channel, combination, server step, history and sampler see only the shared
coordinates; the global model's local coordinates never move. ``after_local`` may return the clients' final models
(FedRep's body phase).

The round names no feature and no component: every role has a do-nothing default that it calls like any other (the
sharing :data:`~lfed.base.sharing.SHARE_ALL` without a local part, the hooks of :class:`~lfed.base.component.Component`
and :class:`~lfed.client.objectives.ClientRule`), and each component checks its own place in the run before round 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from torch import Tensor

from lfed.base.component import Cohort, HostCohort, LocalWork
from lfed.base.declaration import declaration
from lfed.core.algorithm import Algorithm, LocalTraining
from lfed.core.record import RoundRecord, verify_round
from lfed.engine import CohortResult, CohortTrainer
from lfed.engine.host import to_device, values
from lfed.engine.job import TrainJob
from lfed.engine.ranks import Ranks, train_cohort
from lfed.evaluation.scores import client_losses
from lfed.rng import round_generator, seeded_global_rng
from lfed.server.attention import AttentionResult
from lfed.server.combination import ServerCombination
from lfed.server.weight_formulas import DegenerateWeightsWarning

__all__ = ["PreparedRound", "Uploads", "client_uploads", "draw_cohort", "finish_round", "prepare_round", "run_round",
           "server_update", "train_prepared"]


def draw_cohort(algorithm: Algorithm, data: Any, training: LocalTraining, round: int, seed: int,
                total_rounds: int | None = None, clients: Tensor | None = None, steps_done: Tensor | None = None) -> Cohort:
    """The round's cohort: given, or drawn by the sampler and the straggler model from ``seed``.

    Drawn on the host (the sampler's and the stragglers' generators are CPU generators) and kept there
    (:attr:`Cohort.host`); the device copies are queued without waiting (:mod:`lfed.engine.host`).
    """
    N = data.num_clients
    device = data.client_sizes.device
    k = algorithm.participation.cohort_size(round, total_rounds, N)
    if clients is None:
        streams = getattr(algorithm.sampler, "private_streams", None)  # DP's Poisson cohort: its own source
        g = round_generator(seed, round, "sample") if streams is None else streams.generator(seed, round, "sample")
        clients, _ = algorithm.sampler.sample(round, k, g)
    clients_h = clients.detach().cpu().long()  # the samplers draw on the host: no device read
    n_h = data.host("client_sizes")[clients_h]
    budget_h = training.step_budget(n_h)
    if steps_done is None:
        steps_h = algorithm.participation.steps(budget_h, round_generator(seed, round, "stragglers"))
    else:
        steps_h = steps_done.detach().cpu()
    steps_h = steps_h.to(dtype=budget_h.dtype)
    host = HostCohort(clients_h, n_h, budget_h, steps_h)
    return Cohort(round, to_device(clients_h, device), to_device(n_h, device), to_device(budget_h, device),
                  to_device(steps_h, device), N, expected_size=float(k), seed=seed, host=host)


@dataclass
class PreparedRound:
    """A round up to its local training (:func:`prepare_round`), ready for the engine.

    :func:`run_round` is :func:`prepare_round`, the engine, then :func:`finish_round`;
    a group (:mod:`lfed.core.lockstep`, for :class:`lfed.lightning.group.RunGroup`) prepares the rounds of several
    runs, trains all their cohorts in one engine call, and finishes each run's round with its own rows of the result.

    Attributes:
        record: The round's record so far (cohort, weights, warnings, bits down, extra metrics).
        w: ``[P]`` the global weights the round started from.
        job: The cohort's local training (:class:`~lfed.engine.job.TrainJob`); None when the
            round is skipped (``record.skipped``: no client's work counts).
        seed: The run's seed (every draw of the round is seeded by ``(seed, round)``).
        sizes: Numbers of entries of the model's tensors (the channel compresses per tensor).
        training: The run's training plan (lr, batch size, budget), for :class:`~lfed.base.component.LocalWork`.
    """

    record: RoundRecord
    w: Tensor
    job: TrainJob | None
    seed: int
    sizes: list[int]
    training: LocalTraining | None = None

    @property
    def skipped(self) -> bool:
        """Whether no client's work counts (the engine has nothing to train)."""
        return self.job is None


def prepare_round(
    algorithm: Algorithm,
    w: Tensor,
    data: Any,
    training: LocalTraining,
    engine: CohortTrainer,
    *,
    round: int = 0,
    seed: int = 0,
    clients: Tensor | None = None,
    steps_done: Tensor | None = None,
    total_rounds: int | None = None,
    sizes: list[int] | None = None,
    ranks: Ranks | None = None,
) -> PreparedRound:
    """The first half of :func:`run_round`: cohort, aggregation weights, step rule and training job.

    Arguments as :func:`run_round`. The components' state that the step rule reads is read here;
    nothing is written until :func:`finish_round`. When a component asks for it
    (``Needs(start_loss=True)``), each cohort client's loss under ``w`` is computed first
    (:attr:`~lfed.base.component.Cohort.start_loss`, split over the ``ranks``).
    """
    sizes = sizes if sizes is not None else engine.layout.sizes
    cohort = draw_cohort(algorithm, data, training, round, seed, total_rounds, clients, steps_done)
    clients, n_k = cohort.clients, cohort.num_examples
    cohort.plan = training  # the hooks' context: the round's lr, batch size, budget, and the clients' label counts
    host, device = cohort.host, clients.device
    counts = data.label_counts_of(host.clients)  # [K, C] on the host: no device read (lfed.engine.host)
    cohort.label_counts = to_device(counts, device)
    examples = data.gather(clients, host_clients=host.clients)  # (x, y, index [K, L]): the cohort's examples
    if any(declaration(c).needs.start_loss for c in algorithm.roles().values()):
        cohort.start_loss = client_losses(engine, w, *examples, n_k, ranks or Ranks())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DegenerateWeightsWarning)
        weights = to_device(algorithm.weighting.weights(cohort, counts, data.population_label_counts()), device)
    counting = algorithm.weighting.counting(cohort)
    host.counting = counting.detach().cpu()  # the built-in rules' mask is on the host already
    cohort.counting = to_device(counting, device)
    record = RoundRecord(round, cohort, weights, warnings=[str(x.message) for x in caught])
    sizes = algorithm.sharing.shared_sizes_of(sizes)  # only the shared part travels (docs/algorithms.md §13)
    bits = algorithm.channel.bits(sizes)
    record.bits_down = clients.numel() * bits
    if not any(values(host.counting)) and not declaration(algorithm.combination).releases.every_round:
        record.skipped = True
        return PreparedRound(record, w, None, seed, sizes, training)

    for component in algorithm.each():  # what components add to the cohort (the update history)
        component.start_round(cohort)
    lr = training.client_lr
    rule = algorithm.objective.step_rule(cohort, w, lr)
    record.extra.update(algorithm.objective.round_metrics(cohort, lr))  # of the state this round's steps use
    term = algorithm.objective.loss_term(cohort, w)  # objectives that change the loss (MOON, Ditto)
    if term is not None:
        rule = replace(rule, loss_term=term)
    w_start = algorithm.objective.start_weights(cohort, w)  # [P], or [K, P] with local parts (docs/algorithms.md §13)
    data_x, data_y = algorithm.attack.training_data(cohort, data, *examples[:2])  # data poisoning (robustness.md §1)
    job = TrainJob(w_start, data_x, data_y, examples[2], n_k, cohort.steps_done, rule, lr,
                   training.batch_size, round_generator(seed, round, "batches"),
                   buffers=algorithm.objective.start_buffers(cohort),  # per-client running statistics (FedBN)
                   augment=(None if getattr(data, "augment", None) is None  # every step's batch redrawn (lfed.data.augment)
                            else (data.augment, round_generator(seed, round, "augment"))),
                   host_num_examples=host.num_examples, host_steps_done=host.steps_done)
    return PreparedRound(record, w, job, seed, sizes, training)


@dataclass
class Uploads:
    """What the server steps on: the second half of every step, whichever schedule made it (:func:`server_update`).

    A synchronous round's are its cohort's (:func:`client_uploads`); an asynchronous server step's, the ``M`` earliest
    arrivals (:meth:`lfed.core.asynchronous.Asynchronous.arrivals`).

    Attributes:
        record: The step's :class:`~lfed.core.record.RoundRecord`; its cohort are the clients whose uploads these are,
            its ``weights`` their aggregation weights.
        updates: ``[K, P_s]`` the uploads ``Δ_k`` on the shared coordinates, as the server receives them.
        w: ``[P]`` the global model the step started from (the last good model, should the step produce NaN).
        sizes: Entries of each tensor that travels (the channel compresses per tensor).
        buffers: ``{name: [K, ...]}`` the clients' running statistics the global model takes (BatchNorm), or None.
        ends: ``[K, P_s]`` a synchronous round's final client models, as received (the sampler's view); None for an
            asynchronous step's arrivals, of which no component keeps anything (the asynchronous schedule refuses the
            components that would: :mod:`lfed.base.async_ready`).
        rule, lr: The round's step rule and learning rate (the server amplification, docs/algorithms.md §4.5); None
            with ``ends``.
        label: What a step is called in its messages (``round``, ``server step``).
        warnings: The step's warnings (the weighting's), each said once with the step's number.
        measured: What the schedule measured of the step at its arrivals (an asynchronous step: staleness, clock,
            clients in flight), for its ``step_metrics``.
    """

    record: RoundRecord
    updates: Tensor
    w: Tensor
    sizes: list[int]
    buffers: dict[str, Tensor] | None = None
    ends: Tensor | None = None
    rule: Any = None
    lr: float | None = None
    label: str = "round"
    warnings: list[str] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)

    def messages(self) -> list[str]:
        """The step's warnings, each naming the step."""
        return [f"{self.label} {self.record.round}: {m}" for m in self.warnings]


def client_uploads(algorithm: Algorithm, prepared: PreparedRound, result: CohortResult, engine: CohortTrainer,
                   ranks: Ranks | None = None) -> Uploads:
    """The clients' half of a round after their local training: what each client keeps and what it uploads.

    The objective's ``after_local`` (client state: SCAFFOLD's controls, EFL's Fisher reports; or the rule's own final
    models, FedRep's body trained after the head), the local part kept on the client (docs/algorithms.md §13: only the
    shared coordinates leave), the Byzantine rows rewritten (docs/robustness.md §1). Every result is checked
    (queued, read with the metrics: :func:`lfed.core.record.verify_round`).

    Args:
        algorithm: The components of :func:`prepare_round`.
        prepared: What :func:`prepare_round` returned (not skipped).
        result: The engine's result of ``prepared.job`` (its rows, in the cohort's order).
        engine: The cohort trainer (EFL's Fisher reports run on it).
        ranks: The processes (:mod:`lfed.engine.ranks`); None: one.
    """
    ranks = ranks or Ranks()
    record, w, job = prepared.record, prepared.w, prepared.job
    if job is None:
        raise ValueError("prepared: the round was skipped (no client's work counts); there is nothing to finish")
    cohort, r, lr = record.cohort, record.round, job.lr
    record.result, record.losses = result, result.loss
    record.check(result.loss[:, None], "training losses")  # read with the metrics (lfed.engine.host): no sync here
    updates = result.weights - job.w_start
    record.check(updates, "client updates")

    local = LocalWork(engine, ranks, job.data_x, job.data_y, job.index, prepared.seed, r, job.num_examples,
                      job.steps_done, lr, job.batch_size, prepared.training, result.buffers,
                      job.host_num_examples, job.host_steps_done)
    cohort.local_work, cohort.start_model = local, w  # for a combination that trains a model of its own (FLTrust)
    final = algorithm.objective.after_local(cohort, job.w_start, result.weights, lr, local)
    if final is not None:  # the rule's own final models (FedRep: the body trained after the head)
        result = record.result = replace(result, weights=final)
        updates = final - job.w_start
        record.check(updates, "client updates")

    sharing = algorithm.sharing  # docs/algorithms.md §13: the local part never leaves the client (SHARE_ALL: the identity)
    updates, ends = sharing.shared(updates), sharing.shared(result.weights)
    sent = algorithm.attack.poison(updates, cohort)  # the Byzantine rows rewritten (docs/robustness.md §1)
    if sent is not updates:  # what the server receives is what it keeps (history, the sampler's view)
        ends, updates = ends + (sent - updates), sent
        record.check(updates, "client updates")
    return Uploads(record, updates, w, sharing.shared_sizes_of(prepared.sizes), buffers=result.buffers, ends=ends,
                   rule=job.rule, lr=lr, warnings=record.warnings)


def server_update(algorithm: Algorithm, uploads: Uploads, server_step: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """The server's half of every step, both schedules: from the uploads to the new global model ``w' [P]``.

    1. the uploads through the channel (docs/algorithms.md §8), combined with their weights (§4, §5), back through the
       channel: ``Δ``;
    2. the server step on the shared coordinates (§4.1: ``server_step(Δ)``, or ``w + Δ``), the local part kept as it
       was (§13: not server-optimized either, a decay or momentum would move it);
    3. a round's components keep what they need of it (the update history, the sampler's view) and report.

    Records ``delta``, ``attention``, ``bits_up`` and the components' reports on ``uploads.record``; every result is
    checked (queued, read with the metrics).
    """
    record, sharing, sizes = uploads.record, algorithm.sharing, uploads.sizes
    cohort, round_ = record.cohort, uploads.ends is not None
    sent = algorithm.channel.upstream(uploads.updates, cohort, sizes)  # 1. channel, combination, channel
    delta, record.attention = _combined(algorithm.combination.combine(sent, record.weights, cohort), algorithm.combination)
    delta = algorithm.channel.downstream(delta, sizes)
    record.check(delta, "the aggregated update")
    record.delta = delta
    record.bits_up = record.uploads * algorithm.channel.bits(sizes)
    if round_:  # None where not defined (partial sharing)
        amplification = sharing.amplification(delta, uploads.updates, uploads.rule, uploads.lr, cohort, record.weights)
        if amplification is not None:
            record.extra["round/amplification"] = amplification
    full = sharing.expand_shared(delta)  # 2. the server step
    w_new = server_step(full) if server_step is not None else uploads.w + full
    w_new = sharing.keep_local(w_new, uploads.w)
    record.check(w_new, "the global model")
    if round_:  # 3. what the components keep of the round
        w_up, w_new_up = sharing.shared(uploads.w), sharing.shared(w_new)
        for component in algorithm.each():  # the update history
            component.end_round(cohort, uploads.updates, w_up, w_new_up)
        algorithm.sampler.observe(cohort, uploads.ends, w_new_up)
        for component in algorithm.each():  # what the components report
            record.extra.update(component.report(cohort))
    return w_new


def finish_round(
    algorithm: Algorithm,
    prepared: PreparedRound,
    result: CohortResult,
    engine: CohortTrainer,
    *,
    server_step: Callable[[Tensor], Tensor] | None = None,
    ranks: Ranks | None = None,
) -> tuple[Tensor, RoundRecord]:
    """The second half of :func:`run_round`: :func:`client_uploads`, then :func:`server_update`.

    Args as :func:`client_uploads`; ``server_step`` applies ``Δ`` and returns the new weights (None: ``w + Δ``).
    Returns the new global weights and the round's record.
    """
    uploads = client_uploads(algorithm, prepared, result, engine, ranks)
    return server_update(algorithm, uploads, server_step), uploads.record


def train_prepared(engine: CohortTrainer, ranks: Ranks, prepared: PreparedRound) -> CohortResult:
    """The engine's part of one run's step: ``prepared.job`` split over the ranks, a model's own randomness (dropout)
    seeded by the round (:func:`lfed.rng.seeded_global_rng`). :func:`lfed.core.lockstep.train_together` calls it for a run
    that trains alone."""
    with seeded_global_rng(prepared.seed, prepared.record.round, "dropout", prepared.w.device):
        return train_cohort(engine, ranks, prepared.job)


def _combined(out: Any, combination: ServerCombination) -> tuple[Tensor, AttentionResult | None]:
    """``combine``'s return as ``(delta, attention or None)``: a bare ``[P]`` tensor is the update."""
    if isinstance(out, Tensor):
        return out, None
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], Tensor):
        return out
    from lfed.checks import HookError

    raise HookError(f"combine: {type(combination).__name__}.combine returned {type(out).__name__}; return the "
                    "update Δ [P], or (Δ, None) (an attention combination: (Δ, AttentionResult))")


def run_round(
    algorithm: Algorithm,
    w: Tensor,
    data: Any,
    training: LocalTraining,
    engine: CohortTrainer,
    *,
    round: int = 0,
    seed: int = 0,
    clients: Tensor | None = None,
    steps_done: Tensor | None = None,
    total_rounds: int | None = None,
    sizes: list[int] | None = None,
    server_step: Callable[[Tensor], Tensor] | None = None,
    ranks: Ranks | None = None,
) -> tuple[Tensor, RoundRecord]:
    """One federated round (docs/algorithms.md §1): :func:`prepare_round`, the engine, :func:`finish_round`.

    Args:
        algorithm: The components (their state must be allocated: :func:`setup_state`).
        w: ``[P]`` global weights (flat, :class:`~lfed.engine.params.ParamLayout` order).
        data: The federated data on the device (:class:`~lfed.lightning.datamodule.FederatedData`).
        training: Learning rate, batch size and step budget.
        engine: The cohort trainer of the model.
        round: Round index (seeds every draw with ``seed``).
        clients: ``[K]`` a fixed cohort (None: the sampler draws it).
        steps_done: ``[K]`` fixed completed steps (None: the straggler model draws them).
        total_rounds: Rounds of the run (fraction schedules that depend on it).
        sizes: Numbers of entries of the model's tensors (the channel compresses per tensor);
            None: the engine's layout.
        server_step: Applies ``Δ`` and returns the new weights (the server optimizer); None: ``w + Δ``.
        ranks: The processes the cohort's training is split over (:mod:`lfed.engine.ranks`); None: one.

    Returns:
        ``(w_new, record)``; ``w_new is w`` when the round was skipped.
    """
    ranks = ranks or Ranks()
    prepared = prepare_round(algorithm, w, data, training, engine, round=round, seed=seed, clients=clients,
                             steps_done=steps_done, total_rounds=total_rounds, sizes=sizes, ranks=ranks)
    if prepared.skipped:
        return w, prepared.record
    result = train_prepared(engine, ranks, prepared)  # the cohort split over the ranks (lfed.engine.ranks)
    uploads = client_uploads(algorithm, prepared, result, engine, ranks)
    w_new = server_update(algorithm, uploads, server_step)
    verify_round(uploads.record)  # the round's one read from the device: its checks
    return w_new, uploads.record
