"""Rounds of a run without Lightning: :func:`fit_run` (issue 41).

``lfed.settings.build_run(...)`` builds a :class:`~lfed.run.FederatedRun`; ``fit_run(run, datamodule, rounds)``
trains it for ``rounds`` rounds in this process and returns each round's metrics, with the evaluations
asked for. It is the same round as under a ``Trainer`` (:class:`~lfed.driver.FederatedDriver`: prepare, one
engine call, finish with the server step) and gives the same weights bit for bit; what it leaves to
Lightning is the rest: loggers, checkpoints, several devices and mixed precision.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch

__all__ = ["fit_run"]


def fit_run(run, datamodule, rounds: int, *, evaluate_every: int | None = None, device: str | torch.device = "cpu",
            default_root_dir: str | None = None) -> list[dict[str, float]]:
    """Train ``run`` (from :func:`lfed.settings.build_run`) on ``datamodule`` for ``rounds`` more rounds.

    Args:
        run: The run. Its first call sets it up (net, state); a later call goes on where it stopped.
        datamodule: A :class:`~lfed.data.datamodule.FederatedDataModule` (or anything with ``build()``).
        rounds: Rounds to train now, >= 1.
        evaluate_every: Evaluate the global model (:meth:`~lfed.run.FederatedRun.evaluate`) every this many
            rounds and after the last; its metrics join that round's. None: only after the last.
        device: Where the round runs.
        default_root_dir: Where ``client_state='disk'`` files go (None: the working directory).

    Returns:
        One dict per round: the round's metrics (what a logger would receive), evaluations merged in.

    Raises:
        FloatingPointError: A round produced NaN or Inf (the global model stays that of the last good round).
    """
    from lfed.algorithms import CompositionWarning
    from lfed.distributed import Ranks
    from lfed.lockstep import train_together
    from lfed.validation import integer

    integer("rounds", rounds, at_least=1)
    if evaluate_every is not None:
        integer("evaluate_every", evaluate_every, at_least=1, detail=" or None (after the last round only)")
    ranks = Ranks()
    state: dict[str, Any] = run.__dict__.setdefault("_fit_run", {})
    first = run.rounds_done == 0 and "optimizer" not in state
    start, end = run.rounds_done, run.rounds_done + rounds
    if first:
        data = datamodule.build()
        run.datamodule = datamodule
        run.setup(data, default_root_dir)
        run.net.to(device)
        run.data = data.to(torch.device(device), next(run.net.parameters()).dtype, {})
        for message in run.start(run.data, end):
            warnings.warn(message, CompositionWarning, stacklevel=2)
        for line in run.notices():  # DP: where the noise comes from; splits that are client data
            print(f"lfed: {line}", file=sys.stderr)
        state["optimizer"] = run.server_optimizer([p for p in run.net.parameters() if p.requires_grad])
    optimizer = state["optimizer"]
    history: list[dict[str, float]] = []
    for r in range(start, end):
        if not run.running:
            break
        prepared = run.prepare(r, end, ranks)
        result = None if prepared.skipped else train_together([(run, prepared)], ranks)[0][0]
        metrics, messages = run.finish(prepared, result, optimizer, ranks)
        for message in messages:
            warnings.warn(message, stacklevel=2)
        metrics = {k: float(v) for k, v in metrics.items()}
        if (evaluate_every is not None and (r + 1) % evaluate_every == 0) or r + 1 == end:
            evaluated, per_client = run.evaluate(ranks, lambda t: t)
            run.record_evaluation(r + 1, evaluated, per_client)
            metrics.update(run.metric_gate(evaluated))
        history.append(metrics)
        reason = run.stop_reason(r + 1, end) if r + 1 < end else None
        if reason:  # a component forbids the next round (DP's budget)
            run.status, run.error = "stopped", reason
    return history
