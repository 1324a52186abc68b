"""Aggregation weights for the server's weighted mean (docs/algorithms.md §3).

Every function here is a pure function on tensors, vectorised over the ``K`` clients of a
cohort: a weight vector ``a`` of shape ``[K]`` is returned and the server combines
``Δ = Σ_k a_k Δ_k`` (docs/algorithms.md §4, *mean*).

Rules:

* ``size``: ``a_k = n_k / Σ_j n_j`` (FedAvg, McMahan et al. 2017).
* ``uniform``: ``a_k = 1 / K``.
* ``dwfed``: the index of statistical heterogeneity ISH of DWFed (002 §3.2-3.3, eqs. 7, 12, 13),
  computed from label counts only.

Partial work (docs/algorithms.md §3 and §6; EFL, 004 §4.2):

* ``keep``: a client's partial work counts as it is (FedProx behaviour).
* ``drop``: clients with ``s_k < T_k`` are left out and the rest renormalised (FedAvg behaviour).
* ``scale``: ``a_k = a_k^base * T_k / s_k`` for ``0 < s_k < T_k``, *not* renormalised (EFL).

Inactive clients (``s_k = 0``) never count. A round in which no client counts gets all-zero
weights; the caller must then skip the round (leave the model and all state unchanged) and log it.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

__all__ = [
    "WEIGHT_RULES",
    "PARTIAL_WORK",
    "DegenerateWeightsWarning",
    "size_weights",
    "uniform_weights",
    "label_distance",
    "ish",
    "dwfed_weights",
    "counting_mask",
    "aggregation_weights",
]

WEIGHT_RULES = ("size", "uniform", "dwfed")
"""Names of the base aggregation rules accepted by :func:`aggregation_weights`."""

PARTIAL_WORK = ("keep", "drop", "scale")
"""Names of the partial-work treatments accepted by :func:`aggregation_weights`."""


class DegenerateWeightsWarning(UserWarning):
    """Warned when a weighting rule degenerates and falls back to uniform weights.

    Raised by :func:`dwfed_weights` when every counting client's ISH is 0 (possible only when at
    most two clients count, docs/algorithms.md §3). Catch it with ``warnings.catch_warnings(record=True)`` to
    log it through Lightning, or test ``ish(...).sum() == 0`` beforehand.
    """


def _check_vector(name: str, value: Tensor) -> Tensor:
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [K], got {type(value).__name__}")
    if value.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of shape [K], got shape {tuple(value.shape)}")
    if value.is_complex():
        raise ValueError(f"{name} must be real, got dtype {value.dtype}")
    return value


def _check_nonnegative(name: str, value: Tensor) -> None:
    if value.dtype == torch.bool:
        raise ValueError(f"{name} must be a numeric tensor, got dtype torch.bool")
    # .tolist() reads a host tensor without a dispatch (a round passes host values, lfed.engine.host); a device
    # tensor given directly to these functions is read once here
    if value.is_floating_point() and not torch.isfinite(value).all().tolist():
        raise ValueError(f"{name} must be finite, got {value.tolist()}")
    if (value < 0).any().tolist():
        raise ValueError(f"{name} must be non-negative, got {value.tolist()}")


def _out_dtype(dtype: torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.get_default_dtype()
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    return dtype


def size_weights(num_examples: Tensor, *, dtype: torch.dtype | None = None) -> Tensor:
    """Example-count weights ``a_k = n_k / Σ_j n_j`` (docs/algorithms.md §3, *size*; FedAvg).

    Args:
        num_examples: ``[K]`` non-negative example counts ``n_k`` (integer or floating).
        dtype: floating dtype of the result; default ``torch.get_default_dtype()``.

    Returns:
        ``[K]`` weights summing to 1, on the device of ``num_examples``.

    Raises:
        ValueError: if ``num_examples`` is not 1-D, has negative or non-finite entries, or sums to 0.

    Example:
        >>> size_weights(torch.tensor([10, 30, 60]), dtype=torch.float64)
        tensor([0.1000, 0.3000, 0.6000], dtype=torch.float64)
    """
    _check_vector("num_examples", num_examples)
    _check_nonnegative("num_examples", num_examples)
    n = num_examples.to(torch.float64)
    total = n.sum()
    if not (total > 0).tolist():
        raise ValueError(f"num_examples must have a positive sum, got {num_examples.tolist()}")
    return (n / total).to(_out_dtype(dtype))


def uniform_weights(
    num_clients_or_mask: int | Tensor,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Uniform weights ``a_k = 1/|S|`` (docs/algorithms.md §3, *uniform*).

    Args:
        num_clients_or_mask: either the number of clients ``K >= 1`` (all count), or a ``[K]``
            bool mask of the clients that count; clients outside the mask get weight exactly 0,
            and an all-False mask gives all zeros.
        device: device of the result when an int is given (a mask keeps its own device).
        dtype: floating dtype of the result; default ``torch.get_default_dtype()``.

    Returns:
        ``[K]`` weights.

    Raises:
        ValueError: if the int is < 1 or the tensor is not a 1-D bool mask.
    """
    out_dtype = _out_dtype(dtype)
    if isinstance(num_clients_or_mask, Tensor):
        mask = _check_vector("num_clients_or_mask", num_clients_or_mask)
        if mask.dtype != torch.bool:
            raise ValueError(
                f"num_clients_or_mask must be an int or a bool mask, got a tensor of dtype {mask.dtype}"
            )
        m = mask.to(torch.float64)
        return (m / m.sum().clamp_min(1.0)).to(out_dtype)
    if isinstance(num_clients_or_mask, bool) or not isinstance(num_clients_or_mask, int):
        raise ValueError(
            f"num_clients_or_mask must be an int >= 1 or a bool mask, got {num_clients_or_mask!r}"
        )
    if num_clients_or_mask < 1:
        raise ValueError(f"num_clients_or_mask must be >= 1, got {num_clients_or_mask}")
    k = num_clients_or_mask
    return torch.full((k,), 1.0 / k, dtype=torch.float64, device=device).to(out_dtype)


def label_distance(client_label_counts: Tensor, population_label_counts: Tensor) -> Tensor:
    """DWFed's earth mover's distance ``D_k = Σ_y |p_k(y) - P(y)|`` (002 eq. 7; docs/algorithms.md §3).

    Only label counts are used, so no example leaves a client. ``P`` is the population label
    distribution pooled over *all* clients (not only this round's cohort).

    Args:
        client_label_counts: ``[K, C]`` non-negative label counts of each client.
        population_label_counts: ``[C]`` non-negative label counts of the whole population.

    Returns:
        ``[K]`` float64 distances in ``[0, 2]``.

    Raises:
        ValueError: on wrong shapes, negative counts, a client with no examples, or an empty
            population.
    """
    if not isinstance(client_label_counts, Tensor) or client_label_counts.dim() != 2:
        shape = tuple(client_label_counts.shape) if isinstance(client_label_counts, Tensor) else None
        raise ValueError(f"client_label_counts must be a [K, C] tensor, got shape {shape}")
    _check_vector("population_label_counts", population_label_counts)
    if population_label_counts.shape[0] != client_label_counts.shape[1]:
        raise ValueError(
            f"population_label_counts must have C={client_label_counts.shape[1]} entries "
            f"(the columns of client_label_counts), got {population_label_counts.shape[0]}"
        )
    _check_nonnegative("client_label_counts", client_label_counts)
    _check_nonnegative("population_label_counts", population_label_counts)
    counts = client_label_counts.to(torch.float64)
    pop = population_label_counts.to(torch.float64).to(counts.device)
    rows = counts.sum(dim=1)
    if (rows <= 0).any().tolist():  # host values in a round (lfed.engine.host)
        empty = torch.nonzero(rows <= 0).flatten().tolist()
        raise ValueError(f"client_label_counts has clients with no examples (rows {empty})")
    if not (pop.sum() > 0).tolist():
        raise ValueError("population_label_counts must have a positive sum")
    p_k = counts / rows[:, None]
    p = pop / pop.sum()
    return (p_k - p[None, :]).abs().sum(dim=1)


def ish(distance: Tensor, num_counting: int) -> Tensor:
    """DWFed's index of statistical heterogeneity, clamped at 0 (002 eq. 12; docs/algorithms.md §3).

    ``ISH_k = (1 - D_k / K) / (1 + D_k)`` with ``K = num_counting`` the number of clients whose
    work counts this round, then ``max(ISH_k, 0)``. docs/algorithms.md §3 reads the extracted ``1-1KDk1+Dk`` as
    the fraction ``(1 - D_k/K) / (1 + D_k)``. Since ``0 <= D_k <= 2``, ISH can reach 0 only when
    ``K <= 2``.

    Args:
        distance: ``[K]`` label distances ``D_k`` from :func:`label_distance`, in ``[0, 2]``.
        num_counting: number of clients whose work counts this round (``K`` of eq. 12), >= 1.

    Returns:
        ``[K]`` float64 ISH values (>= 0).

    Raises:
        ValueError: if ``distance`` is not 1-D, is outside ``[0, 2]``, or ``num_counting < 1``.
    """
    _check_vector("distance", distance)
    if isinstance(num_counting, bool) or not isinstance(num_counting, int) or num_counting < 1:
        raise ValueError(f"num_counting must be an int >= 1, got {num_counting!r}")
    d = distance.to(torch.float64)
    if not torch.isfinite(d).all().tolist() or ((d < 0) | (d > 2 + 1e-12)).any().tolist():
        raise ValueError(f"distance must lie in [0, 2] (a sum of absolute differences of two "
                         f"distributions), got {distance.tolist()}")
    return ((1.0 - d / num_counting) / (1.0 + d)).clamp_min(0.0)


def dwfed_weights(
    distance: Tensor,
    num_counting: int | None = None,
    *,
    mask: Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """DWFed aggregation weights ``a_k = ISH_k / Σ_j ISH_j`` (002 eqs. 12-13; docs/algorithms.md §3).

    If every counting client's ISH is 0 (only possible for ``K <= 2``), the counting clients get
    uniform weights and a :class:`DegenerateWeightsWarning` is warned so the caller can log it.

    Args:
        distance: ``[K]`` label distances ``D_k`` (:func:`label_distance`).
        num_counting: the ``K`` of eq. 12, the number of clients whose work counts; default: the
            number of True entries of ``mask`` (or ``len(distance)`` without a mask). When given
            with a mask it must equal the mask's count.
        mask: optional ``[K]`` bool mask of the clients that count; the others get weight exactly
            0. If no client counts the result is all zeros.
        dtype: floating dtype of the result; default ``torch.get_default_dtype()``.

    Returns:
        ``[K]`` weights summing to 1 over the counting clients (all zeros if none counts).

    Raises:
        ValueError: on bad shapes or values (see :func:`ish`), or a ``num_counting`` that
            disagrees with ``mask``.
    """
    _check_vector("distance", distance)
    out_dtype = _out_dtype(dtype)
    if mask is None:
        mask = torch.ones_like(distance, dtype=torch.bool)
    else:
        _check_vector("mask", mask)
        if mask.dtype != torch.bool or mask.shape != distance.shape:
            raise ValueError(f"mask must be a bool tensor of shape {tuple(distance.shape)}, "
                             f"got dtype {mask.dtype} and shape {tuple(mask.shape)}")
    counted = mask.sum().tolist()
    if num_counting is None:
        num_counting = counted
    elif num_counting != counted:
        raise ValueError(f"num_counting={num_counting!r} disagrees with mask, which has {counted} "
                         "counting clients")
    if counted == 0:
        return torch.zeros_like(distance, dtype=out_dtype)
    index = ish(distance, num_counting) * mask.to(torch.float64)
    total = index.sum()
    if not (total > 0).tolist():
        warnings.warn(
            f"every counting client's ISH is 0 (K={num_counting}, D={distance.tolist()}); "
            "DWFed falls back to uniform weights this round",
            DegenerateWeightsWarning,
            stacklevel=2,
        )
        return uniform_weights(mask, dtype=out_dtype)
    return (index / total).to(out_dtype)


def counting_mask(steps_done: Tensor, step_budget: Tensor, partial_work: str = "keep") -> Tensor:
    """Which clients' work counts this round (docs/algorithms.md §3), as used by :func:`aggregation_weights`.

    Active clients (``steps_done > 0``) count; with ``partial_work="drop"`` only those that also
    completed their budget (``steps_done >= step_budget``). Use this rather than ``weights > 0``
    to decide whose state to update: a counting client can get weight exactly 0 under DWFed
    (``ISH_k`` clamped at 0 when at most two clients count).

    Args:
        steps_done: ``[K]`` completed local steps ``s_k``.
        step_budget: ``[K]`` planned local steps ``T_k``.
        partial_work: one of :data:`PARTIAL_WORK`.

    Returns:
        ``[K]`` bool mask on the device of ``steps_done``.

    Raises:
        ValueError: on an unknown ``partial_work`` or mismatched shapes.
    """
    if partial_work not in PARTIAL_WORK:
        raise ValueError(f"partial_work must be one of {PARTIAL_WORK}, got {partial_work!r}")
    _check_vector("steps_done", steps_done)
    _check_vector("step_budget", step_budget)
    if step_budget.shape != steps_done.shape:
        raise ValueError(f"step_budget must have the shape of steps_done {tuple(steps_done.shape)}, "
                         f"got {tuple(step_budget.shape)}")
    active = steps_done > 0
    if partial_work == "drop":
        return active & (steps_done >= step_budget.to(steps_done.device))
    return active


def aggregation_weights(
    rule: str,
    *,
    num_examples: Tensor | None = None,
    steps_done: Tensor,
    step_budget: Tensor,
    partial_work: str = "keep",
    client_label_counts: Tensor | None = None,
    population_label_counts: Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Aggregation weights of one round's cohort, with partial work handled (docs/algorithms.md §3).

    1. Inactive clients (``steps_done == 0``) never count (docs/algorithms.md §3, §6).
    2. With ``partial_work="drop"`` clients with ``steps_done < step_budget`` do not count either.
    3. The base ``rule`` is computed over the counting clients only (for DWFed, ``K`` in eq. 12
       is the number of counting clients); non-counting clients get weight exactly 0.
    4. With ``partial_work="scale"`` (EFL, 004 §4.2, ``p_τ^k = E p^k / s_τ^k``) each incomplete
       client's weight is multiplied by ``step_budget / steps_done``; the weights are *not*
       renormalised afterwards, so they sum to more than 1 when someone straggled.

    If no client counts (all inactive, or all dropped) the weights are all zeros: the caller must
    then skip the round, leaving the global model and all state unchanged, and log the skip.

    Args:
        rule: one of :data:`WEIGHT_RULES` (``"size"``, ``"uniform"``, ``"dwfed"``).
        num_examples: ``[K]`` example counts; required for ``"size"``.
        steps_done: ``[K]`` completed local steps ``s_k`` (0 = inactive).
        step_budget: ``[K]`` planned local steps ``T_k`` (>= 1 and >= ``steps_done``).
        partial_work: one of :data:`PARTIAL_WORK` (``"keep"``, ``"drop"``, ``"scale"``).
        client_label_counts: ``[K, C]`` label counts of the cohort; required for ``"dwfed"``.
        population_label_counts: ``[C]`` label counts of all clients; required for ``"dwfed"``.
        dtype: floating dtype of the result; default ``torch.get_default_dtype()``.

    Returns:
        ``[K]`` weights on the device of ``steps_done``.

    Raises:
        ValueError: on an unknown ``rule`` or ``partial_work``, a missing input the rule needs,
            mismatched shapes, or step counts outside ``0 <= steps_done <= step_budget``,
            ``step_budget >= 1``.

    Example:
        >>> aggregation_weights("uniform", steps_done=torch.tensor([4, 2, 0]),
        ...                     step_budget=torch.tensor([4, 4, 4]), partial_work="scale",
        ...                     dtype=torch.float64)
        tensor([0.5000, 1.0000, 0.0000], dtype=torch.float64)
    """
    if rule not in WEIGHT_RULES:
        raise ValueError(f"rule must be one of {WEIGHT_RULES}, got {rule!r}")
    if partial_work not in PARTIAL_WORK:
        raise ValueError(f"partial_work must be one of {PARTIAL_WORK}, got {partial_work!r}")
    out_dtype = _out_dtype(dtype)
    s, t = _checked_steps(steps_done, step_budget, num_examples)
    active = s > 0
    complete = s >= t
    counting = counting_mask(s, t, partial_work)
    num_counting = counting.sum().tolist()
    base = _base_weights(rule, s, counting, num_counting, num_examples, client_label_counts, population_label_counts)
    if num_counting == 0:
        return torch.zeros_like(s, dtype=out_dtype)
    if partial_work == "scale":
        incomplete = active & ~complete
        factor = torch.where(incomplete, t / s.clamp_min(1.0), torch.ones_like(s))
        base = base * factor
    return base.to(out_dtype)


def _checked_steps(steps_done: Tensor, step_budget: Tensor, num_examples: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(s, t)``: :func:`aggregation_weights`' ``steps_done`` and ``step_budget`` as float64 on the steps' device,
    checked (shapes, ``0 <= s <= t``, ``t >= 1``), with ``num_examples``' shape."""
    _check_vector("steps_done", steps_done)
    _check_vector("step_budget", step_budget)
    if step_budget.shape != steps_done.shape:
        raise ValueError(f"step_budget must have the shape of steps_done {tuple(steps_done.shape)}, "
                         f"got {tuple(step_budget.shape)}")
    _check_nonnegative("steps_done", steps_done)
    _check_nonnegative("step_budget", step_budget)
    device = steps_done.device
    s = steps_done.to(torch.float64)
    t = step_budget.to(device=device, dtype=torch.float64)
    if (t < 1).any().tolist():
        raise ValueError(f"step_budget must be >= 1 for every client, got {step_budget.tolist()}")
    if (s > t).any().tolist():
        raise ValueError(f"steps_done must not exceed step_budget, got steps_done="
                         f"{steps_done.tolist()} and step_budget={step_budget.tolist()}")
    if num_examples is not None:
        _check_vector("num_examples", num_examples)
        if num_examples.shape != steps_done.shape:
            raise ValueError(f"num_examples must have the shape of steps_done "
                             f"{tuple(steps_done.shape)}, got {tuple(num_examples.shape)}")
    return s, t


def _base_weights(rule: str, s: Tensor, counting: Tensor, num_counting: int, num_examples: Tensor | None,
                  client_label_counts: Tensor | None, population_label_counts: Tensor | None) -> Tensor:
    """The base ``rule``'s float64 weights over the ``counting`` clients (step 3 of :func:`aggregation_weights`)."""
    device = s.device
    if rule == "size":
        if num_examples is None:
            raise ValueError("num_examples is required for rule='size'")
        _check_nonnegative("num_examples", num_examples)
        n = num_examples.to(device=device, dtype=torch.float64) * counting.to(torch.float64)
        if num_counting > 0 and not (n.sum() > 0).tolist():
            raise ValueError(f"num_examples of the counting clients sum to 0, got "
                             f"{num_examples.tolist()} with counting mask {counting.tolist()}")
        base = n / n.sum().clamp_min(torch.finfo(torch.float64).tiny)
    elif rule == "uniform":
        base = uniform_weights(counting, dtype=torch.float64)
    else:  # dwfed
        if client_label_counts is None or population_label_counts is None:
            raise ValueError("client_label_counts and population_label_counts are required for "
                             "rule='dwfed'")
        if client_label_counts.dim() != 2 or client_label_counts.shape[0] != s.shape[0]:
            raise ValueError(f"client_label_counts must have shape [K={s.shape[0]}, C], "
                             f"got {tuple(client_label_counts.shape)}")
        distance = label_distance(client_label_counts, population_label_counts).to(device)
        if num_counting == 0:
            base = torch.zeros_like(s)
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", DegenerateWeightsWarning)
                base = dwfed_weights(distance, num_counting, mask=counting, dtype=torch.float64)
            for w in caught:  # re-warn from the caller's frame
                warnings.warn(w.message, w.category, stacklevel=3)
    return base
