"""When the server steps: a run's schedule (:class:`lfed.core.step.Schedule`), synchronous rounds.

A training step (:func:`lfed.core.step.train_step`) asks the run's schedule (:attr:`lfed.core.run.FederatedRun.schedule`)
three things, and the run knows nothing of the kinds:

* :meth:`~Synchronous.dispatch`: what trains now (the engine's job);
* :meth:`~Synchronous.arrivals`: what the server steps on, from the engine's result;
* :meth:`~Synchronous.step_metrics`: what the step measured, after the server step;

and, for the run's reports, :meth:`~Synchronous.composition` (its words in the start-up line),
:meth:`~Synchronous.evaluation_metrics` (added to every evaluation: simulated time) and
:meth:`~Synchronous.step_times` (the simulated time after each step, for the end-of-run summary).

* :data:`SYNCHRONOUS` (the default, :class:`Synchronous`): a step is a round (docs/algorithms.md §1): sample a cohort from
  the current model, train it, combine every counting client's update, step the server once;
* :class:`lfed.core.asynchronous.Asynchronous` (FedBuff, FedAsync): a step dispatches clients to keep ``C`` in
  flight, and steps the server on the ``M`` earliest arrivals of a simulated clock.
"""

from __future__ import annotations

from typing import Any

import torch

from lfed.core.round import PreparedRound, Uploads, client_uploads, prepare_round
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

    def dispatch(self, run: Any, round: int, total_rounds: int | None, ranks: Any = None) -> PreparedRound:
        """The round up to its local training (:func:`lfed.core.round.prepare_round`) from the current model."""
        return prepare_round(run.components, run.layout.module_vector(run.net), run.data, run.training_plan,
                             run.engine, round=round, seed=run.seed, total_rounds=total_rounds, sizes=run.layout.sizes,
                             ranks=ranks)

    def arrivals(self, run: Any, prepared: PreparedRound, result: Any, ranks: Any) -> Uploads | None:
        """The cohort's uploads (:func:`lfed.core.round.client_uploads`); None for a skipped round."""
        if prepared.skipped:
            return None
        return client_uploads(run.components, prepared, result, run.engine, ranks)

    def step_metrics(self, run: Any, uploads: Uploads) -> dict[str, Any]:
        """The round's metrics (:meth:`lfed.core.record.RoundRecord.metrics`) and ``client/local_acc_mean``: the counting
        participants' ``w_k_end`` on their own held-out splits (``bmta_local``, docs/algorithms.md §9), scored with the
        new global model's buffers."""
        rec, d = uploads.record, run.data
        metrics = rec.metrics()
        host = rec.cohort.host_values()
        if run.round_local_accuracy and is_classification(d.train_y) and any(values(host.counting)):
            rows = device_rows(host.counting, rec.result.weights.device)
            local = local_accuracy(run.net, run.layout, rec.result.weights[rows], d, rec.cohort.clients[rows],
                                   host_clients=host.clients[host.counting])
            metrics["client/local_acc_mean"] = torch.nanmean(local)
        return metrics


#: The synchronous schedule (stateless: one instance is shared).
SYNCHRONOUS = Synchronous()
