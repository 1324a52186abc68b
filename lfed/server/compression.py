"""Sparse ternary compression with error-feedback residuals (docs/algorithms.md §7; EFL, 004 Algorithm 2).

``ST(x)`` keeps exactly the ``k = max(floor(n*q), 1)`` entries of largest magnitude of a tensor of
``n`` entries and replaces each by ``±μ``, ``μ`` the mean magnitude of the kept entries; the rest
become 0. It is applied per parameter tensor. Upstream each client sends ``ST(R_k + Δ_k)`` and
keeps the rest as its residual; downstream the server does the same with its own residual
(:func:`compress_with_residual` serves both).

All functions are pure and work on any device and floating dtype. The cohort dimension (``[K, P]``
flat updates) is vectorised; the only Python loop is over parameter tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "validate_sparsity",
    "kept_count",
    "ternary",
    "ternary_per_tensor",
    "compress_with_residual",
    "dense_bits",
    "ternary_bits",
]

_FLOAT_BITS = 32
"""Bits of one transmitted float (dense entries and the ternary magnitude μ), docs/algorithms.md §7."""


def validate_sparsity(q: float) -> float:
    """Check a sparsity ``q`` (fraction of entries kept) and return it as a float.

    Args:
        q: the sparsity of 004 Algorithm 2, ``0 < q <= 1``.

    Returns:
        ``float(q)``.

    Raises:
        ValueError: unless ``q`` is a real number with ``0 < q <= 1``.
    """
    if isinstance(q, bool):
        raise ValueError(f"q (sparsity) must be a number in (0, 1], got {q!r}")
    try:
        value = float(q)
    except (TypeError, ValueError):
        raise ValueError(f"q (sparsity) must be a number in (0, 1], got {q!r}") from None
    if not (0.0 < value <= 1.0):  # also rejects NaN
        raise ValueError(f"q (sparsity) must satisfy 0 < q <= 1, got {q!r}")
    return value


def kept_count(n: int, q: float) -> int:
    """Number of entries ST keeps: ``k = max(floor(n*q), 1)`` (docs/algorithms.md §7; 004 Algorithm 2).

    ``n*q`` is snapped to the nearest integer when it lies within a relative ``1e-9`` of it, so
    that decimal sparsities give the intended count: ``100 * 0.29`` is ``28.999999999999996`` in
    floating point, and ``kept_count(100, 0.29)`` is 29, not 28 (likewise ``6 * (1/3)`` gives 2).

    Args:
        n: number of entries of the tensor, ``n >= 1``.
        q: sparsity, ``0 < q <= 1``.

    Returns:
        ``k`` with ``1 <= k <= n``.

    Raises:
        ValueError: if ``n < 1`` or ``q`` is outside ``(0, 1]``.

    Example:
        >>> kept_count(100, 0.29), kept_count(4, 0.5), kept_count(10, 1e-6), kept_count(7, 1.0)
        (29, 2, 1, 7)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (number of entries) must be an int >= 1, got {n!r}")
    q = validate_sparsity(q)
    x = n * q
    nearest = round(x)
    k = nearest if abs(x - nearest) <= 1e-9 * max(1.0, x) else math.floor(x)
    return max(min(k, n), 1)


def ternary(x: Tensor, q: float) -> Tensor:
    """Sparse ternary compression ``ST`` along the last dimension (docs/algorithms.md §7; 004 Algorithm 2).

    For each row ``x[..., :]`` of ``n`` entries: keep exactly ``k = kept_count(n, q)`` entries of
    largest ``|x|`` (ties broken as ``torch.topk`` breaks them; 004 keeps every entry tied with
    the k-th, lfed keeps exactly k), ``μ = mean |x|`` over the kept entries, and return
    ``μ * sign(x)`` on the kept entries and 0 elsewhere. ``q = 1`` is not the identity: every entry
    becomes ``±μ``. An all-zero row gives ``μ = 0`` and an all-zero result.

    Args:
        x: floating tensor ``[..., n]``; leading dimensions (e.g. clients) are independent rows.
        q: sparsity, ``0 < q <= 1``.

    Returns:
        Tensor of the shape, dtype and device of ``x``, with at most ``k`` non-zeros per row, all of
        magnitude ``μ`` of their row.

    Raises:
        ValueError: if ``x`` is not a floating tensor with at least one dimension and one entry per
            row, or ``q`` is outside ``(0, 1]``.

    Example:
        >>> ternary(torch.tensor([3.0, -1.0, 2.0, -4.0]), 0.5)
        tensor([ 3.5000,  0.0000,  0.0000, -3.5000])
    """
    if not isinstance(x, Tensor) or x.dim() == 0 or not x.is_floating_point():
        desc = f"dtype {x.dtype}, shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a floating tensor of shape [..., n], got {desc}")
    n = x.shape[-1]
    if n == 0:
        raise ValueError(f"x must have at least one entry along its last dimension, got shape {tuple(x.shape)}")
    k = kept_count(n, q)
    magnitude = x.abs()
    if k == n:  # every entry kept: μ = mean |x| over the row
        return magnitude.mean(dim=-1, keepdim=True) * torch.sign(x)
    top, index = torch.topk(magnitude, k, dim=-1, largest=True, sorted=False)
    mu = top.mean(dim=-1, keepdim=True)
    signs = torch.sign(torch.gather(x, -1, index))
    return torch.zeros_like(x).scatter_(-1, index, mu * signs)


def _check_sizes(sizes: Sequence[int], length: int | None = None, name: str = "") -> list[int]:
    try:
        sizes = [int(s) if not isinstance(s, bool) else -1 for s in sizes]
    except (TypeError, ValueError):
        raise ValueError(f"sizes must be a list of positive ints, got {sizes!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"sizes must be a non-empty list of positive ints, got {sizes!r}")
    if length is not None and sum(sizes) != length:
        raise ValueError(f"sizes must sum to the last dimension of {name} ({length}), "
                         f"got sum {sum(sizes)} from {sizes!r}")
    return sizes


def ternary_per_tensor(flat: Tensor, sizes: Sequence[int], q: float) -> Tensor:
    """Apply :func:`ternary` to every parameter segment of flat updates (docs/algorithms.md §7, "per tensor").

    Args:
        flat: ``[P]`` or ``[K, P]`` flat parameters (``named_parameters()`` order).
        sizes: numel of each parameter tensor, in order; ``sum(sizes) == P``.
        q: sparsity, ``0 < q <= 1``, the same for every tensor.

    Returns:
        Tensor like ``flat``; each segment (and each client row) is compressed independently, with
        its own ``k`` and ``μ``.

    Raises:
        ValueError: on a ``flat`` that is not 1-D or 2-D floating, ``sizes`` that do not partition
            ``P``, or ``q`` outside ``(0, 1]``.
    """
    if not isinstance(flat, Tensor) or flat.dim() not in (1, 2) or not flat.is_floating_point():
        desc = f"dtype {flat.dtype}, shape {tuple(flat.shape)}" if isinstance(flat, Tensor) else type(flat).__name__
        raise ValueError(f"flat must be a floating tensor of shape [P] or [K, P], got {desc}")
    sizes = _check_sizes(sizes, flat.shape[-1], "flat")
    validate_sparsity(q)
    return torch.cat([ternary(seg, q) for seg in torch.split(flat, sizes, dim=-1)], dim=-1)


def compress_with_residual(
    update: Tensor,
    residual: Tensor,
    sizes: Sequence[int],
    q: float,
    *,
    active: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One error-feedback compression step (docs/algorithms.md §7; 004 eq. 5 and Algorithm 2).

    ``Δ' = R + Δ``; ``sent = ST(Δ')`` per parameter tensor; ``R_new = Δ' - sent``. Serves the
    client side (``[K, P]``: ``R_k``, ``Δ_k``) and the server side (``[P]``: ``R_G`` and the
    aggregated ``Σ a_k ST(Δ_k')``). ``R_new + sent`` equals ``R + Δ`` up to one floating-point
    rounding of the subtraction (exactly whenever ``Δ' - sent`` is representable, e.g. always on
    entries that were not kept).

    Args:
        update: ``[P]`` or ``[K, P]`` update ``Δ``.
        residual: residual ``R`` of the same shape (zeros at the start).
        sizes: numel of each parameter tensor, ``sum(sizes) == P``.
        q: sparsity, ``0 < q <= 1``.
        active: optional ``[K]`` bool mask for ``[K, P]`` input: rows that are False (inactive
            clients, docs/algorithms.md §2 "changes no per-client state") send zeros and keep their residual.

    Returns:
        ``(sent, new_residual)``, both shaped like ``update``.

    Raises:
        ValueError: on mismatched shapes or dtypes, bad ``sizes`` or ``q``, or a bad ``active``.
    """
    if not isinstance(update, Tensor) or not isinstance(residual, Tensor):
        raise ValueError("update and residual must be tensors")
    if residual.shape != update.shape or residual.dtype != update.dtype:
        raise ValueError(f"residual must match update (shape {tuple(update.shape)}, dtype {update.dtype}), "
                         f"got shape {tuple(residual.shape)}, dtype {residual.dtype}")
    total = residual + update
    sent = ternary_per_tensor(total, sizes, q)
    new_residual = total - sent
    if active is not None:
        if (not isinstance(active, Tensor) or active.dtype != torch.bool or update.dim() != 2
                or active.shape != update.shape[:1]):
            raise ValueError(f"active must be a bool tensor of shape [K] for a [K, P] update "
                             f"(update shape {tuple(update.shape)}), got {active!r}")
        keep = active.to(update.device)[:, None]
        sent = torch.where(keep, sent, torch.zeros_like(sent))
        new_residual = torch.where(keep, new_residual, residual)
    return sent, new_residual


def dense_bits(sizes: Sequence[int]) -> int:
    """Bits to send one model's worth of dense float32 tensors: ``Σ 32 n`` (docs/algorithms.md §7).

    Args:
        sizes: numel of each parameter tensor (positive ints).

    Returns:
        Number of bits for one sender.

    Raises:
        ValueError: on sizes that are not positive ints.
    """
    sizes = _check_sizes(sizes)
    return _FLOAT_BITS * sum(sizes)


def ternary_bits(sizes: Sequence[int], q: float) -> int:
    """Bits to send one model's worth of ST-compressed tensors (docs/algorithms.md §7).

    Per tensor of ``n`` entries: ``32 + k * (1 + ceil(log2 n))``, i.e. one float for ``μ`` and, per
    kept entry, a sign bit and a position of ``ceil(log2 n)`` bits (``k = kept_count(n, q)``).

    Args:
        sizes: numel of each parameter tensor (positive ints).
        q: sparsity, ``0 < q <= 1``.

    Returns:
        Number of bits for one sender.

    Raises:
        ValueError: on bad ``sizes`` or ``q``.

    Example:
        >>> ternary_bits([100, 1], 0.29)  # 32 + 29 * (1 + 7) + 32 + 1 * (1 + 0)
        297
    """
    sizes = _check_sizes(sizes)
    validate_sparsity(q)
    # ceil(log2 n) computed exactly on integers: (n - 1).bit_length()
    return sum(_FLOAT_BITS + kept_count(n, q) * (1 + (n - 1).bit_length()) for n in sizes)
