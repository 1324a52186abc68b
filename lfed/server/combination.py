"""Server combinations as components of the round (docs/algorithms.md §4).

A :class:`ServerCombination` turns the cohort's (sent) updates ``[K, P]``, their weights and the
counting mask into the server's update ``Δ``, and returns what it wants logged. Two here:
:class:`Mean` (``Δ = Σ_k a_k Δ_k``) and :class:`IGFLAttention` (IGFL-S, query ``self``,
``global`` or ``time``; the maths is :func:`lfed.server.attention.attention_combine`). A
combination may declare server state (see :mod:`lfed.client.feddyn`).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from lfed.base.component import Cohort, Component
from lfed.base.declaration import Declaration, Needs, Releases, Supports
from lfed.checks import number, one_of
from lfed.server.attention import QUERIES, TIME_WEIGHTS, AttentionResult

__all__ = ["IGFLAttention", "Mean", "ServerCombination"]


class ServerCombination(Component):
    """Base class: the plain weighted mean ``Δ = Σ_k a_k Δ_k``.

    :meth:`combine` returns ``(Δ, attention)``; ``attention`` is an
    :class:`~lfed.server.attention.AttentionResult` for attention combinations, else None.
    """

    name = "mean"
    # its kind's reason (a subclass that says nothing is refused asynchronously with it); a combination that runs in a
    # round with no counting client (DP-FedAvg releases its noise) declares Releases(every_round=True)
    declares = Declaration(supports=Supports(asynchronous="is not defined on a buffer of stale updates yet; use mean"))

    def combine(self, updates: Tensor, weights: Tensor, cohort: Cohort) -> tuple[Tensor, AttentionResult | None]:
        """``Δ`` from ``updates [K, P]`` and ``weights [K]`` (0 for clients whose work does not count)."""
        return weights.to(updates.dtype) @ updates, None


class Mean(ServerCombination):
    """The weighted mean ``Δ = Σ_k a_k Δ_k`` (FedAvg)."""

    declares = Declaration(supports=Supports(asynchronous=True))


class IGFLAttention(ServerCombination):
    """IGFL-S attention (000 Algorithm 3; docs/algorithms.md §4): ``Δ = Σ_j α_j Δ_j``.

    The weights ``a_k`` are not used; only which clients count (``cohort.counting``) matters.

    Args:
        query: ``self`` (each update queries the others), ``global`` (the mean update queries)
            or ``time`` (each client's previous update queries).
        temperature: ``τ > 0`` dividing every logit ``ψ``; 1 is the paper.
        time_weights: For ``time``: ``softmax`` (default; weights sum to 1) or ``diagonal``
            (000 L172 read literally; not renormalised). docs/algorithms.md §4.
    """

    RELEASE = ("IGFL-S attention weighs each client's raw update by the softmax of its similarity to the others' "
               "(unbounded sensitivity), in place of DP-FedAvg's clipped, noised sum")

    def __init__(
        self,
        query: Literal[QUERIES] = "self",  # type: ignore[valid-type]
        temperature: float = 1.0,
        time_weights: Literal[TIME_WEIGHTS] = "softmax",  # type: ignore[valid-type]
    ) -> None:
        super().__init__()
        one_of("query", query, QUERIES)
        self.query = query
        self.temperature = check_attention_settings(temperature, time_weights)
        self.time_weights = time_weights

    @property
    def declares(self) -> Declaration:  # type: ignore[override]
        """Its release; time attention reads the update history."""
        return Declaration(releases=Releases(values=(self.RELEASE,)), needs=Needs(history=self.query == "time"))

    @property
    def name(self) -> str:  # the config name of the preset string (aggregation: self|global|time)
        return self.query

    def check(self, context) -> list[str]:
        out = []
        ignored = [k for k in ("weighting",) if k in context.explicit]
        weighting = (context.components or {}).get("weighting")
        if getattr(weighting, "partial_work", None) == "scale" and "partial_work" in context.explicit:
            ignored.append("partial_work='scale'")
        if ignored:
            out.append(f"combination={self.query!r} (IGFL-S attention) weighs updates by attention, so "
                       f"{', '.join(ignored)} has no effect (only which clients count matters); use combination='mean'")
        sizes, N = context.cohort_sizes, context.num_clients
        if self.query == "time" and sizes:
            per_client = sum(sizes) / N
            if per_client < 2:
                out.append(
                    f"combination='time' uses each client's previous update as its query, but {context.total_rounds} rounds "
                    f"of {min(sizes)}-{max(sizes)} of {N} clients give each client {per_client:.2g} "
                    "participations on average: a first participation has a zero query (weight 1/|S|), so time "
                    "attention is mostly the plain mean; run more rounds or sample more clients")
        return out

    def hparams(self) -> dict:
        return {"temperature": self.temperature}

    def structure(self) -> dict:
        return {"time_weights": self.time_weights} if self.query == "time" else {}

    def combine(self, updates: Tensor, weights: Tensor, cohort: Cohort) -> tuple[Tensor, AttentionResult | None]:
        from lfed.server import attention  # looked up per call, so a test can spy on attention_combine

        res = attention.attention_combine(
            updates, query=self.query, previous_updates=cohort.previous_update, temperature=self.temperature,
            mask=cohort.counting, time_weights=self.time_weights,
        )
        return res.update, res


def check_attention_settings(temperature: float, time_weights: str) -> float:
    """Check IGFL-S's temperature (finite, > 0) and ``time_weights``; return the temperature as a float."""
    one_of("time_weights", time_weights, TIME_WEIGHTS)
    return number("attention_temperature", temperature, above=0)
