"""Batch schedules: which examples each client's every local step uses.

Both backends consume the same schedule (:func:`batch_schedule`), drawn from a CPU generator
alone, so they (and any device) see the same batches and agree to round-off.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def steps_per_epoch(num_examples: Tensor, batch_size: int | None) -> Tensor:
    """``ceil(n_k / B)`` per client (1 for full-batch, ``batch_size=None``)."""
    if batch_size is None:
        return torch.ones_like(num_examples)
    return torch.div(num_examples + batch_size - 1, batch_size, rounding_mode="floor").clamp_min(1)


def batch_schedule(
    num_examples: Tensor, num_steps: int, batch_size: int | None, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Mini-batch positions of every client for every local step of a round.

    Client k reshuffles its ``n_k`` examples at the start of each local epoch and walks
    through them in batches of ``B`` (the last one partial). Step ``t`` is batch
    ``t mod ceil(n_k/B)`` of epoch ``t // ceil(n_k/B)``.

    Args:
        num_examples: ``[K]`` client sizes ``n_k``.
        num_steps: Number of steps to schedule (the largest step count of the cohort).
        batch_size: ``B``, or None for full-batch steps.
        generator: CPU generator; the schedule depends on it alone, so both backends and
            any device see the same batches.

    Returns:
        ``positions [K, T, B']`` (indices into each client's own example list) and
        ``valid [K, T, B']`` (False on padding), with ``B' = min(B, max n_k)``.
    """
    n = num_examples.detach().cpu().long()  # the round gives the host copy (lfed.engine.host): no device read
    K, max_n = n.numel(), max(n.tolist(), default=0)
    B = max_n if batch_size is None else min(int(batch_size), max_n)
    nb = steps_per_epoch(n, batch_size)
    T = max(int(num_steps), 0)
    if T == 0:
        empty = torch.zeros(K, 0, B, dtype=torch.long)
        return empty, empty.bool()
    epochs = torch.div(T + nb - 1, nb, rounding_mode="floor").max().tolist()
    keys = torch.rand(K, epochs, max_n, generator=generator, dtype=torch.float64)
    keys.masked_fill_((torch.arange(max_n) >= n[:, None])[:, None, :], math.inf)
    perm = keys.argsort(dim=-1)
    t = torch.arange(T)
    epoch = torch.div(t[None, :], nb[:, None], rounding_mode="floor")  # [K, T]
    batch = t[None, :] % nb[:, None]
    pos = batch[..., None] * (B if batch_size is not None else max_n) + torch.arange(B)  # [K, T, B]
    valid = pos < n[:, None, None]
    positions = perm[torch.arange(K)[:, None, None], epoch[..., None], pos.clamp(max=max_n - 1)]
    return positions, valid
