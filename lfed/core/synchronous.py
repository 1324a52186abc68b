"""When the server steps: a run's schedule, the role that turns one training step into one server update.

A :class:`~lfed.core.run.FederatedRun` prepares and finishes each training step through its schedule
(:attr:`lfed.core.run.FederatedRun.schedule`), and knows nothing of the kinds:

* :data:`SYNCHRONOUS` (the default, :class:`Synchronous`): a step is a round (docs/algorithms.md §1): sample a cohort from the
  current model, train it, combine every counting client's update, step the server once;
* :class:`lfed.core.asynchronous.Asynchronous` (FedBuff, FedAsync): a step dispatches clients to keep ``C`` in
  flight, and steps the server on the ``M`` earliest arrivals of a simulated clock.

A schedule has five methods: :meth:`~Synchronous.prepare` (the step up to its local training: the engine's
job), :meth:`~Synchronous.finish` (the rest, from the engine's result: metrics and warnings),
:meth:`~Synchronous.composition` (its words in the run's start-up line), :meth:`~Synchronous.evaluation_metrics`
(added to every evaluation: simulated time) and :meth:`~Synchronous.step_times` (the simulated time after each
step, for the end-of-run summary).
"""

from __future__ import annotations

from typing import Any

import torch

from lfed.core.round import finish_round, prepare_round
from lfed.engine.host import device_rows, values
from lfed.evaluation.scores import is_classification, local_accuracy

__all__ = ["SYNCHRONOUS", "Synchronous"]


class Synchronous:
    """Synchronous rounds (docs/algorithms.md §1): every training step is one round of one cohort. The do-nothing default of the
    schedule role: no words in the start-up line, no simulated clock."""

    def composition(self) -> dict[str, str]:
        """Its entries in the run's composition line (none)."""
        return {}

    def evaluation_metrics(self) -> dict[str, float]:
        """What every evaluation adds (nothing)."""
        return {}

    def step_times(self) -> list[float]:
        """Simulated seconds after each step (none: a synchronous run has no clock)."""
        return []

    def prepare(self, run: Any, round: int, total_rounds: int | None, ranks: Any = None) -> Any:
        """The round up to its local training (:func:`lfed.core.round.prepare_round`)."""
        return prepare_round(run.components, run.layout.module_vector(run.net), run.data, run.training_plan,
                             run.engine, round=round, seed=run.seed, total_rounds=total_rounds, sizes=run.layout.sizes,
                             ranks=ranks)

    def finish(self, run: Any, prepared: Any, result: Any, optimizer: torch.optim.Optimizer,
               ranks: Any) -> tuple[dict[str, float], list[str]]:
        """The rest of the round (:func:`lfed.core.round.finish_round`) and its bookkeeping: the net's buffers,
        ``bmta_local`` (docs/algorithms.md §9), communication. A skipped round steps the optimizer with no gradient."""
        rec = prepared.record
        r = rec.round
        if prepared.skipped:
            optimizer.zero_grad(set_to_none=True)
            optimizer.step()  # no gradients: advances the round counter only
            return run.conclude_skipped(rec), [f"round {r}: no client's work counts (all inactive or dropped); "
                                               "the round is skipped"]
        w_new, rec = finish_round(run.components, prepared, result, run.engine,
                                  server_step=run.server_step(optimizer), ranks=ranks)
        run.layout.load_into(run.net, w_new)  # the server step's model, but the local part as it was (Sharing.keep_local)
        if rec.result.buffers is not None:
            run.aggregate_buffers(rec.result.buffers, rec.weights)
        local = None  # bmta_local (docs/algorithms.md §9): the counting participants' w_k_end on their own held-out splits
        host, clients, d = rec.cohort.host_values(), rec.cohort.clients, run.data
        if run.round_local_accuracy and is_classification(d.train_y) and any(values(host.counting)):
            rows = device_rows(host.counting, rec.result.weights.device)
            local = local_accuracy(run.net, run.layout, rec.result.weights[rows], d, clients[rows],
                                   host_clients=host.clients[host.counting])
        metrics = rec.metrics()
        if local is not None:
            metrics["client/local_acc_mean"] = torch.nanmean(local)
        return run.conclude(rec, metrics, prepared.w), [f"round {r}: {m}" for m in rec.warnings]


#: The synchronous schedule (stateless: one instance is shared).
SYNCHRONOUS = Synchronous()
