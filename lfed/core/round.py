"""One federated round as a function: components in, new weights and a record out (docs/algorithms.md §1).

:func:`run_round` needs no Trainer: give it the global weights ``w [P]``, an :class:`Algorithm`
(its components hold their declared state, :mod:`lfed.state.spec`), the federated data on the
device, a :class:`LocalTraining` and a :class:`~lfed.engine.CohortTrainer`; optionally a fixed
cohort and fixed step counts (otherwise the algorithm's sampler and straggler model draw them
from ``seed``). It returns the new global weights and a :class:`RoundRecord` (cohort, steps,
aggregation weights, attention and its entropy and logit spread, losses, bits), and moves the
components' state on. :class:`~lfed.lightning.module.FederatedModule` is a Lightning driver around it.

Order of a round (docs/algorithms.md §1)::

    cohort, s_k  = sampler, participation          # §5, §6 (or given)
    a_k, counts  = weights                         # §3
    rule         = objective.step_rule(cohort)     # §2
    w_k_end      = engine.train(...)               # local work, all clients at once
    objective.after_local(...)                     # client state
    sent         = channel.upstream(Δ_k)           # §7
    Δ            = combination.combine(sent, a_k)  # §4
    Δ            = channel.downstream(Δ)
    w'           = server_step(Δ)                  # §4.1 (w + Δ by default)
    history, sampler.observe(w_k_end, w')          # state that needs the new model

With partial sharing (docs/algorithms.md §13, :class:`lfed.personal.sharing.Sharing`, resolved by
:meth:`Algorithm.attach`) each client starts from the global shared part and its own local part
(``objective.start_weights``), and the channel, combination, server step, history and sampler see
only the shared coordinates; the global model's local coordinates never move. ``after_local`` may
return the clients' final models (FedRep's body phase).

The round names no feature and no component: every role has a do-nothing default that it calls
like any other (the sharing :data:`~lfed.base.sharing.SHARE_ALL` without a local part, the hooks
of :class:`~lfed.base.component.Component` and :class:`~lfed.client.objectives.ClientRule`), and each
component checks its own place in the run (:meth:`~lfed.base.component.Component.prepare_run`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from lfed.base.attack import NoAttack
from lfed.base.component import Cohort, Component, HostCohort, LocalWork, each_once
from lfed.base.sharing import SHARE_ALL, resolve_sharing
from lfed.client.objectives import ClientRule
from lfed.engine import CohortResult, CohortTrainer, steps_per_epoch
from lfed.engine.host import device_rows, read_metrics, to_device, values
from lfed.engine.job import TrainJob
from lfed.engine.ranks import Ranks, train_cohort
from lfed.evaluation.amplification import gradient_displacement, server_amplification  # noqa: F401 (lfed.core.round's names since 0.3)
from lfed.evaluation.scores import client_losses
from lfed.participation.participation import Participation
from lfed.participation.sampling import ClientSampler
from lfed.rng import round_generator, seeded_global_rng
from lfed.server.attention import AttentionResult
from lfed.server.channel import Channel
from lfed.server.combination import ServerCombination
from lfed.server.weight_formulas import DegenerateWeightsWarning
from lfed.server.weighting import AggregationWeights
from lfed.state.spec import StateSpec

__all__ = ["Algorithm", "LocalTraining", "PreparedRound", "RoundRecord", "UpdateHistory", "finish_round", "prepare_round",
           "run_round", "verify_round"]


class UpdateHistory(Component):
    """Each client's update from the last round it took part in, and the global model's last change.

    IGFL-C's correction and time attention read it (components with ``uses_history``); the round
    keeps it: after the server step ``Δw_k ← Δ_k`` for active clients and ``Δw_ps ← w' - w``.
    """

    name = "history"
    asynchronous_unready = "(a component reads the update history) is not defined asynchronously yet"

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("previous_update"), StateSpec("global_change", per_client=False)]

    def fill(self, cohort: Cohort) -> None:
        cohort.previous_update = self.rows("previous_update", cohort.clients)
        cohort.global_change = self.state("global_change")

    def record(self, cohort: Cohort, updates: Tensor, w_old: Tensor, w_new: Tensor) -> None:
        self.write_rows("previous_update", cohort.clients, updates, mask=cohort.active)
        self.set_state("global_change", w_new - w_old)

    def start_round(self, cohort: Cohort) -> None:  # the round's hooks (lfed.base.component.Component)
        self.fill(cohort)

    def end_round(self, cohort: Cohort, updates: Tensor, w_old: Tensor, w_new: Tensor) -> None:
        self.record(cohort, updates, w_old, w_new)


@dataclass
class Algorithm:
    """The components of a round, one per role (see :mod:`lfed.base.component`).

    ``history`` is made when a component reads the update history (IGFL-C, time attention).
    """

    objective: ClientRule
    weighting: AggregationWeights
    combination: ServerCombination
    channel: Channel
    sampler: ClientSampler
    participation: Participation
    history: UpdateHistory | None = None
    sharing: Any = SHARE_ALL  # lfed.personal.sharing: Sharing, or SHARE_ALL (every parameter shared); Algorithm.attach
    asynchronous: Any = None  # lfed.core.asynchronous.Asynchronous: the round is a server step of FedBuff / FedAsync
    attack: Any = None  # lfed.robust.attacks.Attack: the run's Byzantine clients (None: NoAttack, none)

    def __post_init__(self) -> None:
        self.sharing = self.sharing or SHARE_ALL  # None (before 0.4): every parameter shared
        if self.attack is None:
            self.attack = NoAttack()
        if self.history is None and any(c.uses_history for c in self.roles().values()):
            self.history = UpdateHistory()

    def attach(self, net, layout) -> None:
        """Resolve the objective's partial sharing (:meth:`ClientRule.make_sharing`) for ``net``; before state is allocated.

        With a :class:`~lfed.personal.sharing.Sharing`, the round uploads, compresses, counts bits for,
        combines and server-steps only its shared coordinates; the objective keeps the local ones. Without
        one (``make_sharing`` returns None) it is :data:`~lfed.base.sharing.SHARE_ALL`.
        """
        self.sharing = resolve_sharing(self.objective, net, layout)

    def each(self) -> list[Component]:
        """Every component once (one component may hold two roles: FedDyn), in the order of :meth:`roles`."""
        return each_once(self.roles().values())

    def roles(self) -> dict[str, Component]:
        """``{role: component}`` of every component (the history too when there is one)."""
        out = {
            "objective": self.objective, "weighting": self.weighting, "combination": self.combination,
            "channel": self.channel, "sampler": self.sampler, "participation": self.participation,
        }
        if self.history is not None:
            out["history"] = self.history
        if self.attack.present:  # a role only with Byzantine clients: a run without keeps its fingerprint
            out["attack"] = self.attack
        if self.asynchronous is not None:  # first: its refusals come before the other components' preparations
            out = {"asynchronous": self.asynchronous, **out}
        return out


@dataclass(frozen=True)
class LocalTraining:
    """How clients train: learning rate ``eta_l``, batch size, and the step budget ``T_k``.

    Attributes:
        client_lr: Client learning rate.
        batch_size: Mini-batch size ``B`` (None: full batch).
        local_epochs: Epochs ``E``; the budget is ``E * ceil(n_k / B)``.
        local_steps: A fixed budget of steps per round instead (None: epochs).
    """

    client_lr: float = 0.05
    batch_size: int | None = 10
    local_epochs: int = 1
    local_steps: int | None = None

    def __post_init__(self) -> None:
        from lfed.checks import integer, number

        object.__setattr__(self, "client_lr", float(number("client_lr", self.client_lr, above=0)))
        if self.batch_size is not None:
            integer("batch_size", self.batch_size, at_least=1, detail=" or None (full batch)")
        if self.local_steps is None:
            integer("local_epochs", self.local_epochs, at_least=1)
        else:
            integer("local_steps", self.local_steps, at_least=1, detail=" or None (local_epochs)")
            if self.local_epochs != 1:  # a fixed budget of steps replaces the epochs: both given, one would be ignored
                raise ValueError(f"local_epochs: {self.local_epochs} would be ignored, because local_steps: "
                                 f"{self.local_steps} sets a fixed budget of steps; give one of them")

    def step_budget(self, num_examples: Tensor) -> Tensor:
        """Planned local steps ``T_k``: ``local_steps``, or ``E * ceil(n_k / B)``."""
        if self.local_steps is not None:
            return torch.full_like(num_examples, self.local_steps)
        return self.local_epochs * steps_per_epoch(num_examples, self.batch_size)


@dataclass
class RoundRecord:
    """What a round did.

    Attributes:
        round: Round index.
        cohort: The :class:`~lfed.base.component.Cohort` (clients, sizes, budgets, steps done, counting).
        weights: ``[K]`` float64 aggregation weights (0 for clients whose work does not count).
        losses: ``[K]`` mean training loss of each client (0 for inactive ones).
        delta: ``[P]`` the update the model moved by (before the server optimizer), or None if skipped.
        attention: The :class:`~lfed.server.attention.AttentionResult` of an attention combination.
        bits_up: Bits uploaded (counting clients), ``bits_down``: bits broadcast (whole cohort).
        skipped: Whether no client's work counted (model and state unchanged, docs/algorithms.md §3).
        warnings: Messages the round's pieces warned (e.g. DWFed's uniform fall-back).
        result: The engine's :class:`~lfed.engine.CohortResult` (final client weights, buffers).
        extra: Scalars the components report for this round (:meth:`ClientRule.round_metrics`,
            e.g. EFL's ``efl/max_lr_lambda_u``), logged with the rest.
    """

    round: int
    cohort: Cohort
    weights: Tensor
    losses: Tensor | None = None
    delta: Tensor | None = None
    attention: AttentionResult | None = None
    bits_up: int = 0
    bits_down: int = 0
    skipped: bool = False
    warnings: list[str] = field(default_factory=list)
    result: CohortResult | None = None
    extra: dict[str, float | Tensor] = field(default_factory=dict)
    checks: list[tuple[str, Tensor, Tensor]] = field(default_factory=list)

    @property
    def uploads(self) -> int:
        """Clients whose model the server received and used."""
        return sum(values(self.cohort.host_values().counting))

    def metrics(self) -> dict[str, float | Tensor]:
        """Scalars to log: clients, active, weight sum, loss, attention entropy / logit spread / ||Δ||².

        Host values are floats; what the device computed stays there as 0-dim tensors, read once with
        the round's finiteness flags (:func:`lfed.engine.host.read_metrics`).
        """
        host = self.cohort.host_values()
        active = values(host.active)
        out: dict[str, float | Tensor] = {"round/clients": float(len(active)), "round/active": float(sum(active)),
                                          "round/weight_sum": self.weights.sum()}
        if self.losses is not None and any(active):
            out["train/loss"] = self.losses[device_rows(host.active, self.losses.device)].mean()
        a = self.attention
        if a is not None:
            out["attention/entropy"] = a.entropy
            out["attention/weight_sum"] = a.weights.sum()
            out["attention/logit_spread"] = a.logit_spread
            out["attention/mean_sq_norm"] = a.mean_sq_norm
        out.update(self.extra)
        return out

    def check(self, x: Tensor, what: str, clients: Tensor | None = None) -> None:
        """Queue the check that ``x`` is finite; :meth:`finite_flags` holds its flag on the device, read with the metrics.
        ``clients``: whose rows ``x`` holds, when not the cohort's (an asynchronous step's dispatched clients)."""
        self.checks.append((what, x, torch.isfinite(x).all(), clients))

    def finite_flags(self) -> dict[str, Tensor]:
        """``{what: 0-dim bool on the device}`` of every queued check (:meth:`check`)."""
        return {f"finite/{i}": flag for i, (_, _, flag, _) in enumerate(self.checks)}

    def raise_if_nonfinite(self, flags: dict[str, bool]) -> None:
        """Raise ``FloatingPointError`` (naming the clients) for the first check whose read flag is False."""
        for i, (what, x, _, clients) in enumerate(self.checks):
            if not flags.get(f"finite/{i}", True):
                check_finite(x, self.round, self.cohort.clients if clients is None else clients, what)


def check_finite(x: Tensor, r: int, clients: Tensor, what: str) -> None:
    """Stop the run before bad numbers are saved (NaN/Inf in ``x``), naming the clients."""
    if bool(torch.isfinite(x).all()):
        return
    if x.dim() == 2:
        detail = f"from clients {clients[~torch.isfinite(x).all(dim=1)].tolist()}"
    else:
        detail = f"(cohort {clients.tolist()})"
    raise FloatingPointError(
        f"round {r}: {what} contain NaN or Inf {detail}; stopping so no bad weights are saved. "
        "Lower client_lr, check the data of these clients, or resume from the last good checkpoint."
    )


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
    (``needs_start_loss``), each cohort client's loss under ``w`` is computed first
    (:attr:`~lfed.base.component.Cohort.start_loss`, split over the ``ranks``).
    """
    sizes = sizes if sizes is not None else engine.layout.sizes
    cohort = draw_cohort(algorithm, data, training, round, seed, total_rounds, clients, steps_done)
    clients, n_k = cohort.clients, cohort.num_examples
    cohort.plan = training  # the hooks' context: the round's lr, batch size, budget, and the clients' label counts
    counts_all = getattr(data, "label_counts", None)
    cohort.label_counts = None if counts_all is None else counts_all[clients.to(counts_all.device)]
    if any(c.needs_start_loss for c in algorithm.roles().values()):
        cohort.start_loss = client_losses(engine, w, data.train_x, data.train_y, data.client_index[clients], n_k,
                                          ranks or Ranks())
    host, device = cohort.host, clients.device
    counts = data.host("label_counts")  # host values: no device read (lfed.engine.host)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DegenerateWeightsWarning)
        weights = to_device(algorithm.weighting.weights(cohort, counts[host.clients], data.population_label_counts()),
                            device)
    counting = algorithm.weighting.counting(cohort)
    host.counting = counting.detach().cpu()  # the built-in rules' mask is on the host already
    cohort.counting = to_device(counting, device)
    record = RoundRecord(round, cohort, weights, warnings=[str(x.message) for x in caught])
    sizes = algorithm.sharing.shared_sizes_of(sizes)  # only the shared part travels (docs/algorithms.md §13)
    bits = algorithm.channel.bits(sizes)
    record.bits_down = clients.numel() * bits
    if not any(values(host.counting)) and not algorithm.combination.releases_every_round:
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
    data_x, data_y = algorithm.attack.training_data(cohort, data, data.train_x, data.train_y)  # data poisoning (robustness.md §1)
    job = TrainJob(w_start, data_x, data_y, data.client_index[clients], n_k, cohort.steps_done, rule, lr,
                   training.batch_size, round_generator(seed, round, "batches"),
                   buffers=algorithm.objective.start_buffers(cohort),  # per-client running statistics (FedBN)
                   augment=(None if getattr(data, "augment", None) is None  # every step's batch redrawn (lfed.data.augment)
                            else (data.augment, round_generator(seed, round, "augment"))),
                   host_num_examples=host.num_examples, host_steps_done=host.steps_done)
    return PreparedRound(record, w, job, seed, sizes, training)


def finish_round(
    algorithm: Algorithm,
    prepared: PreparedRound,
    result: CohortResult,
    engine: CohortTrainer,
    *,
    server_step: Callable[[Tensor], Tensor] | None = None,
    ranks: Ranks | None = None,
) -> tuple[Tensor, RoundRecord]:
    """The second half of :func:`run_round`: from the cohort's trained weights to the new global model.

    Args:
        algorithm: The components of :func:`prepare_round`.
        prepared: What :func:`prepare_round` returned (not skipped).
        result: The engine's result of ``prepared.job`` (its rows, in the cohort's order).
        engine: The cohort trainer (EFL's Fisher reports run on it).
        server_step: Applies ``Δ`` and returns the new weights; None: ``w + Δ``.
        ranks: The processes (:mod:`lfed.engine.ranks`); None: one.
    """
    ranks = ranks or Ranks()
    record, w, job, sizes = prepared.record, prepared.w, prepared.job, prepared.sizes
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

    sharing = algorithm.sharing  # docs/algorithms.md §13: the local part never leaves the client (SHARE_ALL: every method the identity)
    sizes = sharing.shared_sizes_of(sizes)
    updates, w_up, ends = sharing.shared(updates), sharing.shared(w), sharing.shared(result.weights)
    sent = algorithm.attack.poison(updates, cohort)  # the Byzantine rows rewritten (docs/robustness.md §1)
    if sent is not updates:  # what the server receives is what it keeps (history, the sampler's view)
        ends, updates = ends + (sent - updates), sent
        record.check(updates, "client updates")
    delta = aggregate(algorithm, record, updates, record.weights, sizes)
    amplification = sharing.amplification(delta, updates, job.rule, lr, cohort, record.weights)  # None: not defined
    if amplification is not None:
        record.extra["round/amplification"] = amplification
    w_new = step_server(algorithm, record, delta, w, server_step)
    w_new_up = sharing.shared(w_new)
    for component in algorithm.each():  # what components keep of the round (the update history)
        component.end_round(cohort, updates, w_up, w_new_up)
    algorithm.sampler.observe(cohort, ends, w_new_up)
    for component in algorithm.each():  # what the components report
        record.extra.update(component.report(cohort))
    return w_new, record


def aggregate(algorithm: Algorithm, record: RoundRecord, updates: Tensor, weights: Tensor, sizes: list[int]) -> Tensor:
    """The server's half of a step up to the new model, shared by both schedules (:mod:`lfed.core.synchronous`): the
    ``[K, P_s]`` uploads through the channel (docs/algorithms.md §8), combined with ``weights`` (docs/algorithms.md §4, §5), back through the
    channel; checked. Records ``delta``, ``attention`` and ``bits_up`` on ``record``; returns ``Δ [P_s]``."""
    cohort = record.cohort
    sent = algorithm.channel.upstream(updates, cohort, sizes)
    delta, record.attention = _combined(algorithm.combination.combine(sent, weights, cohort), algorithm.combination)
    delta = algorithm.channel.downstream(delta, sizes)
    record.check(delta, "the aggregated update")
    record.delta = delta
    record.bits_up = record.uploads * algorithm.channel.bits(sizes)
    return delta


def step_server(algorithm: Algorithm, record: RoundRecord, delta: Tensor, w: Tensor,
                server_step: Callable[[Tensor], Tensor] | None) -> Tensor:
    """The new global model from ``Δ`` (shared by both schedules): the server step on the shared coordinates, the
    local part kept as it was (docs/algorithms.md §13: not server-optimized either, a decay or momentum would move it); checked."""
    full = algorithm.sharing.expand_shared(delta)
    w_new = server_step(full) if server_step is not None else w + full
    w_new = algorithm.sharing.keep_local(w_new, w)
    record.check(w_new, "the global model")
    return w_new


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
    w_new, record = finish_round(algorithm, prepared, result, engine, server_step=server_step, ranks=ranks)
    verify_round(record)
    return w_new, record


def verify_round(record: RoundRecord, metrics: dict[str, Any] | None = None) -> dict[str, float]:
    """Read the round's finiteness flags (and ``metrics``, :meth:`RoundRecord.metrics`) in one transfer.

    Returns:
        The metrics as floats (``round/amplification`` left out where it is not defined, NaN).

    Raises:
        FloatingPointError: naming the clients, if the round produced NaN or Inf (:func:`check_finite`).
    """
    checks = record.finite_flags()
    agree = record.cohort.host_agreement()
    if agree is not None:
        checks["cohort/host_copies_agree"] = agree
    read, flags = read_metrics(metrics or {}, checks)
    if not flags.get("cohort/host_copies_agree", True):
        raise RuntimeError(f"round {record.round}: the cohort's device and host copies (clients, sizes, budgets, steps "
                           "done, counting) disagree; a component changed one without the other (lfed.base.component.Cohort.host)")
    record.raise_if_nonfinite(flags)
    if math.isnan(read.get("round/amplification", 0.0)):
        read.pop("round/amplification")
    return read


def setup_state(algorithm: Algorithm, store, num_examples: Tensor, num_params: int, like: Tensor) -> None:
    """Allocate every component's declared state in ``store`` (each component once).

    With partial sharing (:attr:`Algorithm.sharing`, docs/algorithms.md §13) a component's ``"P"`` is the number of
    coordinates it handles (:meth:`~lfed.personal.sharing.Sharing.state_size`): the shared ones (``P_s``)
    for every role but the objective, the local ones (``P_l``) for the objective, whose rows hold each
    client's local part; without it, ``num_params`` for every role.
    """
    seen: set[int] = set()
    for role, component in algorithm.roles().items():
        if id(component) in seen:
            continue
        seen.add(id(component))
        if hasattr(store, "register_owner"):
            store.register_owner(role, component)
        P = algorithm.sharing.state_size(num_params, local=component is algorithm.objective)
        component.setup_state(store, num_examples, P, like)
