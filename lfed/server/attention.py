"""IGFL-S attention combination of client updates (docs/algorithms.md §4; 000 Algorithm 3, §4.1-4.3).

The server treats the cohort's updates ``Δ_j`` as keys and values and a query per client:

``α_ij = softmax_j ψ(q_i, Δ_j) / τ``,  ``Δ̂_i = Σ_j α_ij Δ_j``,

with ``ψ`` the dot product over the whole flattened update and ``τ`` an optional temperature
(1 in the paper). Three queries:

* ``self`` (Option I, §4.1): ``q_i = Δ_i``; ``Δ = (1/|S|) Σ_i Δ̂_i``.
* ``global`` (Option II, §4.2): one query ``q = mean_k Δ_k``; ``Δ = Σ_j α_j Δ_j``.
* ``time`` (Option III, §4.3): client ``j``'s query is its own previous update ``q_j`` (zero if
  none); ``Δ = Σ_j α_j Δ_j`` with, by ``time_weights`` (docs/algorithms.md §4),

  - ``softmax`` (default): ``α_j = exp ψ(q_j, Δ_j) / Σ_τ exp ψ(q_τ, Δ_τ)``, a softmax over the
    cohort of each client's similarity to its own previous update (sums to 1);
  - ``diagonal`` (000 L172 read literally): ``α_j = exp ψ(q_j, Δ_j) / Σ_τ exp ψ(q_j, Δ_τ)``, the
    diagonal of the row-softmax matrix. These weights need not sum to 1 and are deliberately
    not renormalised.

Dot products are computed in float64 and the softmax subtracts the row maximum, so whole-model
dot products of size 1e4 and beyond stay finite (the attention simply saturates; watch
:attr:`AttentionResult.entropy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["QUERIES", "TIME_WEIGHTS", "AttentionResult", "attention_combine"]

QUERIES = ("self", "global", "time")
"""Names of the attention queries accepted by :func:`attention_combine`."""

TIME_WEIGHTS = ("softmax", "diagonal")
"""The two readings of time attention's weights (docs/algorithms.md §4)."""

_CHUNK_ELEMS = 1 << 24
"""Upper bound on the float64 elements materialised per chunk of a dot-product computation."""


@dataclass
class AttentionResult:
    """Output of :func:`attention_combine`.

    Attributes:
        update: ``[P]`` combined server update ``Δ``, dtype of the input updates.
        weights: ``[K]`` float64 effective weight of each client's update, ``Δ = Σ_j weights_j Δ_j``;
            exactly 0 for masked clients. Sums to 1 for ``self`` and ``global``; for ``time`` the
            sum is the per-round server step size to log.
        matrix: float64 row-softmax matrix ``α`` for heatmaps: ``[K, K]`` (rows = queries, columns =
            keys) for ``self`` and ``time`` with ``diagonal`` weights, ``[1, K]`` for ``global`` and
            for ``time`` with ``softmax`` weights; masked rows/columns are 0.
        entropy: float64 scalar, the mean over query rows of the row entropy of ``α`` in nats
            (``log K`` for uniform attention, 0 when saturated).
        logit_spread: float64 scalar, the mean over query rows of ``max - min`` of the row's logits
            ``ψ/τ`` over the kept keys (docs/algorithms.md §4: small spreads mean near-uniform attention).
        mean_sq_norm: float64 scalar, the mean ``||Δ_k||²`` of the kept updates.
        query: the query used (``"self"``, ``"global"`` or ``"time"``).
        mask: ``[K]`` bool, the clients that took part (keys, and query rows for ``self``/``time``).
    """

    update: Tensor
    weights: Tensor
    matrix: Tensor
    entropy: Tensor
    query: str = "self"
    mask: Tensor | None = None
    logit_spread: Tensor | None = None
    mean_sq_norm: Tensor | None = None

    @property
    def weight_sum(self) -> Tensor:
        """Sum of :attr:`weights` (1 for ``self``/``global``; log it for ``time``, docs/algorithms.md §4)."""
        return self.weights.sum()


def _gram(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b.T`` in float64, chunked over the columns to bound the float64 copies.

    Args:
        a: ``[Q, P]``.
        b: ``[K, P]``.

    Returns:
        ``[Q, K]`` float64 dot products.
    """
    if a.dtype == torch.float64 and b.dtype == torch.float64:
        return a @ b.T
    p = a.shape[1]
    step = max(1, _CHUNK_ELEMS // max(a.shape[0] + b.shape[0], 1))
    out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
    for start in range(0, p, step):
        out += a[:, start:start + step].double() @ b[:, start:start + step].double().T
    return out


def _weighted_row_sum64(weights: Tensor, rows: Tensor) -> Tensor:
    """``weights @ rows`` in float64 (``[K]`` x ``[K, P]`` -> ``[P]``), chunked over ``P``."""
    if rows.dtype == torch.float64:
        return weights @ rows
    p = rows.shape[1]
    step = max(1, _CHUNK_ELEMS // max(rows.shape[0], 1))
    out = torch.empty(p, dtype=torch.float64, device=rows.device)
    for start in range(0, p, step):
        out[start:start + step] = weights @ rows[:, start:start + step].double()
    return out


def attention_combine(
    updates: Tensor,
    query: str = "self",
    previous_updates: Tensor | None = None,
    temperature: float = 1.0,
    mask: Tensor | None = None,
    time_weights: str = "softmax",
) -> AttentionResult:
    """Combine a cohort's updates with IGFL-S attention (docs/algorithms.md §4; 000 Algorithm 3, eq. 11).

    ``ψ_ij = <q_i, Δ_j> / temperature`` in float64; ``α = softmax`` over the keys ``j`` of each row,
    computed stably (row maximum subtracted).

    * ``"self"``: ``q_i = Δ_i``; ``Δ = (1/K) Σ_i Σ_j α_ij Δ_j``, so ``weights_j = mean_i α_ij``.
    * ``"global"``: ``q = mean_k Δ_k``; ``Δ = Σ_j α_j Δ_j``.
    * ``"time"``: ``q_j = previous_updates[j]`` (pass zeros for a client with no previous update);
      ``time_weights="softmax"``: ``weights = softmax_j ψ(q_j, Δ_j)`` over the cohort;
      ``time_weights="diagonal"``: ``weights_j = α_jj = exp ψ(q_j, Δ_j) / Σ_τ exp ψ(q_j, Δ_τ)``,
      not renormalised.

    Args:
        updates: ``[K, P]`` client updates ``Δ_k`` (floating, any device).
        query: one of :data:`QUERIES`.
        previous_updates: ``[K, P]`` each client's update from the last round it took part in
            (zeros if none); required for ``"time"``, ignored otherwise.
        temperature: ``τ > 0`` dividing every dot product (1 = the paper).
        mask: optional ``[K]`` bool, True for clients whose update takes part. Masked-out clients
            (e.g. inactive ones) are excluded from keys and queries, ``K`` above counts only the
            kept clients, and their weight is exactly 0. If no client is kept the result is all
            zeros (the caller skips such rounds, docs/algorithms.md §3).
        time_weights: ``"softmax"`` or ``"diagonal"`` (:data:`TIME_WEIGHTS`), for ``"time"`` only.

    Returns:
        :class:`AttentionResult`; ``update`` has the dtype and device of ``updates``.

    Raises:
        ValueError: on an unknown ``query``, a non-positive or non-finite ``temperature``, bad
            shapes or dtypes, a missing ``previous_updates`` for ``"time"``, or non-finite dot
            products (NaN/inf in the updates, or overflow of float64).

    Example:
        >>> r = attention_combine(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), "global")
        >>> r.update  # q = [1, 0.5], ψ = [1, 1.5], Δ = [α_1 + α_2, α_2]
        tensor([1.0000, 0.6225])
    """
    mask, previous_updates = _checked(updates, query, previous_updates, temperature, mask, time_weights)
    k, p = updates.shape
    device = updates.device
    maskf = mask.to(torch.float64)
    n_kept = int(mask.sum())
    one_row = query == "global" or (query == "time" and time_weights == "softmax")
    rows = 1 if one_row else k
    if n_kept == 0:
        zero = torch.zeros((), dtype=torch.float64, device=device)
        return AttentionResult(
            update=torch.zeros(p, dtype=updates.dtype, device=device),
            weights=torch.zeros(k, dtype=torch.float64, device=device),
            matrix=torch.zeros(rows, k, dtype=torch.float64, device=device),
            entropy=zero,
            query=query,
            mask=mask,
            logit_spread=zero,
            mean_sq_norm=zero,
        )
    psi, row_kept = _logits(updates, query, previous_updates, time_weights, mask, maskf, n_kept)
    psi, alpha = _softmax_kept(psi / temperature, mask, maskf, row_kept)
    entropy, logit_spread, mean_sq_norm = _diagnostics(alpha, psi, updates, mask, maskf, row_kept, n_kept)
    if query == "self":
        weights = alpha.sum(dim=0) / n_kept
    elif one_row:
        weights = alpha[0]
    else:
        weights = torch.diagonal(alpha) * maskf
    update = weights.to(updates.dtype) @ updates
    return AttentionResult(update=update, weights=weights, matrix=alpha, entropy=entropy, query=query, mask=mask,
                           logit_spread=logit_spread, mean_sq_norm=mean_sq_norm)


def _checked(updates: Tensor, query: str, previous_updates: Tensor | None, temperature: float, mask: Tensor | None,
             time_weights: str) -> tuple[Tensor, Tensor | None]:
    """Refuse bad arguments of :func:`attention_combine` (naming the argument); ``(mask, previous_updates)`` on the
    updates' device (the mask all True when None)."""
    if query not in QUERIES:
        raise ValueError(f"query must be one of {QUERIES}, got {query!r}")
    if time_weights not in TIME_WEIGHTS:
        raise ValueError(f"time_weights must be one of {TIME_WEIGHTS}, got {time_weights!r}")
    if not isinstance(updates, Tensor) or updates.dim() != 2 or not updates.is_floating_point():
        desc = (f"dtype {updates.dtype}, shape {tuple(updates.shape)}" if isinstance(updates, Tensor)
                else type(updates).__name__)
        raise ValueError(f"updates must be a floating tensor of shape [K, P], got {desc}")
    k, p = updates.shape
    if k < 1:
        raise ValueError(f"updates must hold at least one client, got shape {tuple(updates.shape)}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    device = updates.device
    if mask is None:
        mask = torch.ones(k, dtype=torch.bool, device=device)
    else:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != (k,):
            desc = (f"dtype {mask.dtype}, shape {tuple(mask.shape)}" if isinstance(mask, Tensor)
                    else type(mask).__name__)
            raise ValueError(f"mask must be a bool tensor of shape [K]=({k},), got {desc}")
        mask = mask.to(device)
    if query == "time":
        if previous_updates is None:
            raise ValueError("previous_updates is required for query='time' (zeros for clients "
                             "with no previous update)")
        if not isinstance(previous_updates, Tensor) or previous_updates.shape != updates.shape:
            shape = tuple(previous_updates.shape) if isinstance(previous_updates, Tensor) else None
            raise ValueError(f"previous_updates must have the shape of updates {(k, p)}, got {shape}")
        if not previous_updates.is_floating_point():
            raise ValueError(f"previous_updates must be floating, got dtype {previous_updates.dtype}")
        previous_updates = previous_updates.to(device)
    return mask, previous_updates


def _logits(updates: Tensor, query: str, previous_updates: Tensor | None, time_weights: str, mask: Tensor, maskf: Tensor,
            n_kept: int) -> tuple[Tensor, Tensor]:
    """``(ψ, row_kept)``: the float64 dot products of the queries with the keys ``[rows, K]`` (before the temperature),
    and which query rows count."""
    device = updates.device
    if query == "self":
        psi = _gram(updates, updates)
        row_kept = mask
    elif query == "global":
        q = _weighted_row_sum64(maskf / n_kept, updates)  # mean of the kept updates, float64
        psi = _gram(q[None, :], updates)
        row_kept = torch.ones(1, dtype=torch.bool, device=device)
    elif time_weights == "diagonal":
        psi = _gram(previous_updates, updates)
        row_kept = mask
    else:  # time, softmax over the cohort of ψ(q_j, Δ_j)
        psi = _row_dots(previous_updates, updates)[None, :]
        row_kept = torch.ones(1, dtype=torch.bool, device=device)
    return psi, row_kept


def _softmax_kept(psi: Tensor, mask: Tensor, maskf: Tensor, row_kept: Tensor) -> tuple[Tensor, Tensor]:
    """``(ψ masked, α)``: each kept row's stable softmax over the kept keys (row maximum subtracted), exactly 0 for a
    masked-out key or a dropped row; non-finite logits refused."""
    valid = row_kept[:, None] & mask[None, :]
    if not bool(torch.isfinite(psi[valid]).all()):
        raise ValueError("attention dot products are not finite: updates or previous_updates "
                         "contain NaN/inf, or their dot products overflow float64")
    psi = psi.masked_fill(~mask[None, :], float("-inf"))
    psi = psi.masked_fill(~row_kept[:, None], 0.0)  # dropped query rows: harmless finite values
    z = psi - psi.amax(dim=1, keepdim=True)
    e = torch.exp(z)
    alpha = e / e.sum(dim=1, keepdim=True)
    alpha = alpha * row_kept[:, None].to(torch.float64) * maskf[None, :]
    return psi, alpha


def _diagnostics(alpha: Tensor, psi: Tensor, updates: Tensor, mask: Tensor, maskf: Tensor, row_kept: Tensor,
                 n_kept: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(entropy, logit_spread, mean_sq_norm)`` of :class:`AttentionResult`: the kept rows' mean entropy of ``α`` and
    spread of the kept logits, and the kept updates' mean squared norm."""
    row_entropy = -torch.special.xlogy(alpha, alpha).sum(dim=1)
    entropy = (row_entropy * row_kept.to(torch.float64)).sum() / row_kept.sum()
    kept_logits = psi.masked_fill(~mask[None, :], float("nan"))
    spread = torch.nan_to_num(kept_logits.nan_to_num(float("-inf")).amax(1) - kept_logits.nan_to_num(float("inf")).amin(1))
    logit_spread = (spread * row_kept.to(torch.float64)).sum() / row_kept.sum()
    mean_sq_norm = (_row_dots(updates, updates) * maskf).sum() / n_kept
    return entropy, logit_spread, mean_sq_norm


def _row_dots(a: Tensor, b: Tensor) -> Tensor:
    """``[K]`` float64 row-wise dot products ``<a_k, b_k>`` (chunked like :func:`_gram`)."""
    if a.dtype == torch.float64 and b.dtype == torch.float64:
        return (a * b).sum(1)
    step = max(1, _CHUNK_ELEMS // max(a.shape[0], 1))
    out = torch.zeros(a.shape[0], dtype=torch.float64, device=a.device)
    for start in range(0, a.shape[1], step):
        out += (a[:, start:start + step].double() * b[:, start:start + step].double()).sum(1)
    return out
