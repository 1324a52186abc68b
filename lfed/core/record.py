"""What a round did, and its one read from the device: :class:`RoundRecord`, :func:`verify_round`.

A round (:mod:`lfed.core.round`) fills a :class:`RoundRecord` (cohort, weights, losses, the update, attention, bits,
warnings, the components' reports) and queues its finiteness checks on the device; :func:`verify_round` reads them
with the round's metrics in one transfer and raises, naming the clients, on NaN or Inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.engine import CohortResult
from lfed.engine.host import device_rows, read_metrics, values
from lfed.server.attention import AttentionResult

__all__ = ["RoundRecord", "check_finite", "verify_round"]


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
