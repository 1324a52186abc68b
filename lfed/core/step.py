"""One training step of every running run: the one place a round is told, top-down (docs/algorithms.md §1).

The Lightning driver (:class:`lfed.lightning.driver.FederatedDriver`: a run alone, or a grid's runs in lock-step) and
:func:`lfed.core.fit.fit_run` (no Trainer) both call :func:`train_step` and add only what is theirs (logging,
evaluation, checkpoints). A step is, for every running run:

1. **dispatch**: its schedule says what trains now (a synchronous round: the cohort, its weights and step rule,
   :func:`lfed.core.round.prepare_round`; an asynchronous server step: the clients dispatched to keep ``C`` in flight);
2. **train**: every run's cohort at once, in as few engine calls as exact (:func:`lfed.core.lockstep.train_together`);
3. **arrivals**: its schedule says what the server steps on (a round: its cohort's uploads,
   :func:`lfed.core.round.client_uploads`; an asynchronous step: the ``M`` earliest arrivals);
4. **server**: the one server half of both (:func:`lfed.core.round.server_update`: channel, combination, server
   step, what the components keep), then the global model takes the arrivals' running statistics;
5. **conclude**: the step's one read from the device, the run's accounts, what it may release
   (:meth:`lfed.core.run.FederatedRun.conclude`);
6. **stop**: a component may forbid the next round (DP's budget).

A schedule (:data:`lfed.core.synchronous.SYNCHRONOUS`, :class:`lfed.core.asynchronous.Asynchronous`) is the small
protocol of steps 1, 3 and 5 (:class:`Schedule`); it reads the run, and the run knows nothing of its kinds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from lfed.core.lockstep import train_together
from lfed.core.round import PreparedRound, Uploads, server_update
from lfed.core.run import FederatedRun
from lfed.engine import CohortResult
from lfed.engine.ranks import Ranks

__all__ = ["Schedule", "StepOutcome", "finish_step", "train_step"]


class Schedule(Protocol):
    """When the server steps (:mod:`lfed.core.synchronous`, :mod:`lfed.core.asynchronous`): what trains now, what the
    server steps on, what the step measured; and its words in the run's reports."""

    def dispatch(self, run: FederatedRun, step: int, total_rounds: int | None, ranks: Ranks | None) -> PreparedRound:
        """What trains at step ``step``: the engine's job (``job`` None: nothing to train)."""

    def arrivals(self, run: FederatedRun, prepared: PreparedRound, result: CohortResult | None,
                 ranks: Ranks) -> Uploads | None:
        """What the server steps on, from the engine's ``result``; None: nothing (a skipped round)."""

    def step_metrics(self, run: FederatedRun, uploads: Uploads) -> dict[str, Any]:
        """The step's metrics, after the server step (device values stay 0-dim tensors, read once by ``conclude``)."""

    def composition(self) -> dict[str, str]:
        """Its entries in the run's composition line."""

    def evaluation_metrics(self) -> dict[str, float]:
        """What every evaluation adds (simulated time)."""

    def step_times(self) -> list[float]:
        """Simulated seconds after each step (none without a clock)."""


@dataclass
class StepOutcome:
    """What one training step did to one run (:func:`train_step`).

    Attributes:
        run: The run.
        metrics: The step's metrics, gated (:attr:`FederatedRun.metric_gate`); None when the run did not step.
        messages: Its warnings (degenerate weights, a skipped round), each naming the round.
        error: The ``FloatingPointError`` that stopped it this step (NaN or Inf; the net is that of the last good
            round); the caller decides (alone, the error ends the fit; in a group the others go on).
        stopped: Why the run must not train the next round (a component's ``stop_before``: DP's budget), or None;
            the run's status is ``"stopped"`` then.
    """

    run: FederatedRun
    metrics: dict[str, float] | None = None
    messages: list[str] = field(default_factory=list)
    error: FloatingPointError | None = None
    stopped: str | None = None


def train_step(runs: Sequence[FederatedRun], optimizers: Sequence[torch.optim.Optimizer], round: int,
               total_rounds: int | None, ranks: Ranks) -> tuple[list[StepOutcome], int]:
    """One training step of every running run (module docstring: steps 1 to 6).

    Returns:
        One :class:`StepOutcome` per running run (in ``runs``' order), and the number of engine calls.
    """
    outcomes: list[StepOutcome] = []
    todo: list[tuple[StepOutcome, PreparedRound, torch.optim.Optimizer]] = []
    for run, optimizer in zip(runs, optimizers):  # 1. dispatch: what trains now
        if not run.running:
            continue
        outcome = StepOutcome(run)
        outcomes.append(outcome)
        try:
            prepared = run.schedule.dispatch(run, round, total_rounds, ranks)
        except FloatingPointError as e:  # the start losses of a cohort (needs_start_loss)
            outcome.error = e
            continue
        todo.append((outcome, prepared, optimizer))
    trained = [(o.run, p) for o, p, _ in todo if not p.skipped]
    results, calls = train_together(trained, ranks) if trained else ([], 0)  # 2. train, every run's cohort at once
    result_of = {id(p): r for (_, p), r in zip(trained, results)}
    for outcome, prepared, optimizer in todo:  # 3 to 5, each run
        try:
            outcome.metrics, outcome.messages = finish_step(outcome.run, prepared, result_of.get(id(prepared)),
                                                            optimizer, ranks)
        except FloatingPointError as e:
            outcome.error = e
    last = total_rounds is not None and round + 1 >= total_rounds  # no round follows the last: nothing to forbid
    for outcome in outcomes:  # 6. stop
        run = outcome.run
        reason = run.stop_reason(round + 1, total_rounds) if outcome.error is None and run.running and not last else None
        if reason:
            run.status, run.error, outcome.stopped = "stopped", reason, reason
    return outcomes, calls


def finish_step(run: FederatedRun, prepared: PreparedRound, result: CohortResult | None,
                optimizer: torch.optim.Optimizer, ranks: Ranks) -> tuple[dict[str, float], list[str]]:
    """Steps 3 to 5 of one run (module docstring), from the engine's ``result``: its metrics and its warnings.

    A skipped round (no client's work counts) steps the optimizer with no gradient (the round counter only).
    Raises ``FloatingPointError`` if the step produced NaN or Inf (the net back at the last good model).
    """
    uploads = run.schedule.arrivals(run, prepared, result, ranks)  # 3. what the server steps on
    if uploads is None:  # nobody's work counts: the cohort was sent the model, nobody's upload counts
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()  # no gradients: advances the round counter only
        record = prepared.record
        return run.conclude_skipped(record), [f"round {record.round}: no client's work counts (all inactive or "
                                              "dropped); the round is skipped"]
    w_new = server_update(run.components, uploads, run.server_step(optimizer))  # 4. the server half
    run.layout.load_into(run.net, w_new)  # the server step's model, the local part as it was (Sharing.keep_local)
    if uploads.buffers is not None:  # the arrivals' running statistics (BatchNorm), as weighted
        run.aggregate_buffers(uploads.buffers, uploads.record.weights)
    metrics = run.schedule.step_metrics(run, uploads)  # 5. conclude: one read, the accounts, what may be released
    return run.conclude(uploads.record, metrics, uploads.w), uploads.messages()
