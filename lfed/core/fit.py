"""Rounds of a run without Lightning: :func:`fit_run` (issue 41).

``lfed.core.settings.build_run(...)`` builds a :class:`~lfed.core.run.FederatedRun`; ``fit_run(run, datamodule, rounds)``
trains it for ``rounds`` rounds in this process and returns each round's metrics, with the evaluations asked
for. It is the same round as under a ``Trainer`` (:class:`~lfed.lightning.driver.FederatedDriver`: prepare, one engine
call, finish with the server step: :func:`lfed.core.step.train_step`) and gives the same weights bit for bit; what it
leaves to Lightning is the rest: loggers, checkpoints, several devices and mixed precision.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch

__all__ = ["fit_run"]


def fit_run(run, datamodule, rounds: int, *, total_rounds: int | None = None, evaluate_every: int | None = None,
            device: str | torch.device = "cpu", default_root_dir: str | None = None) -> list[dict[str, float]]:
    """Train ``run`` (from :func:`lfed.core.settings.build_run`) on ``datamodule`` for ``rounds`` more rounds.

    Args:
        run: The run. Its first call sets it up (net, state); a later call goes on where it stopped.
        datamodule: A :class:`~lfed.lightning.datamodule.FederatedDataModule` (or anything with ``build()``).
        rounds: Rounds to train now, >= 1.
        total_rounds: The run's horizon, the ``trainer.max_steps`` of a Lightning run: what a schedule over the
            whole run (AdaFL's growing fraction) and DP's calibrated noise are set for. Fixed by the first call
            (default: its ``rounds``); calls in pieces within it equal one call (``fit_run(run, dm, 2,
            total_rounds=4)`` then ``fit_run(run, dm, 2)`` is ``fit_run(run, dm, 4)``). A call past it is refused
            where the run depends on it, and extends it where nothing does.
        evaluate_every: Evaluate the global model (:meth:`~lfed.core.run.FederatedRun.evaluate`) every this many
            rounds and after the last; its metrics join that round's. None: only after the last.
        device: Where the round runs.
        default_root_dir: Where ``client_state='disk'`` files go (None: the working directory).

    Returns:
        One dict per round: the round's metrics (what a logger would receive), evaluations merged in.

    Raises:
        FloatingPointError: A round produced NaN or Inf (the global model stays that of the last good round).
    """
    from lfed.checks import integer
    from lfed.core.registry import CompositionWarning
    from lfed.core.step import train_step
    from lfed.engine.ranks import Ranks

    integer("rounds", rounds, at_least=1)
    if evaluate_every is not None:
        integer("evaluate_every", evaluate_every, at_least=1, detail=" or None (after the last round only)")
    if total_rounds is not None:
        integer("total_rounds", total_rounds, at_least=1, detail=" or None (this call's rounds)")
    ranks = Ranks()
    state: dict[str, Any] = run.__dict__.setdefault("_fit_run", {})
    first = run.rounds_done == 0 and "optimizer" not in state
    start, end = run.rounds_done, run.rounds_done + rounds
    horizon = horizon_of(run, state, first, total_rounds, end)
    if first:
        data = datamodule.build()
        run.datamodule = datamodule
        run.setup(data, default_root_dir)
        run.net.to(device)
        run.data = data.to(torch.device(device), next(run.net.parameters()).dtype, {})
        for message in run.start(run.data, horizon):
            warnings.warn(message, CompositionWarning, stacklevel=2)
        for line in run.notices():  # DP: where the noise comes from; splits that are client data
            print(f"lfed: {line}", file=sys.stderr)
        state["optimizer"] = run.server_optimizer([p for p in run.net.parameters() if p.requires_grad])
    history: list[dict[str, float]] = []
    for r in range(start, end):
        if not run.running:
            break
        (outcome,), _ = train_step([run], [state["optimizer"]], r, horizon, ranks)
        if outcome.error is not None:
            raise outcome.error
        for message in outcome.messages:
            warnings.warn(message, stacklevel=2)
        metrics = {k: float(v) for k, v in outcome.metrics.items()}
        if (evaluate_every is not None and (r + 1) % evaluate_every == 0) or r + 1 == end:
            evaluated, per_client = run.evaluate(ranks, lambda t: t)
            run.record_evaluation(r + 1, evaluated, per_client)
            metrics.update(run.metric_gate(evaluated))
        history.append(metrics)
    return history


def horizon_of(run, state: dict[str, Any], first: bool, total_rounds: int | None, end: int) -> int:
    """The run's horizon for this :func:`fit_run` call (its docstring), kept in ``state["total_rounds"]``."""
    if first:
        if total_rounds is not None and end > total_rounds:
            raise ValueError(f"rounds: {end} rounds would go past total_rounds = {total_rounds}")
        state["total_rounds"] = end if total_rounds is None else total_rounds
        return state["total_rounds"]
    horizon = state.get("total_rounds", end)
    if total_rounds is not None and total_rounds != horizon:
        raise ValueError(f"total_rounds: the run's horizon was fixed at {horizon} by its first fit_run call; got {total_rounds}")
    if end > horizon:
        depends = run.depends_on_total_rounds()
        if depends:
            raise ValueError(f"rounds: this call would train to round {end}, past the {horizon} rounds the run was set for "
                             f"({depends} depends on them); give total_rounds={end} (or more) in the first fit_run call")
        state["total_rounds"] = horizon = end
    return horizon
