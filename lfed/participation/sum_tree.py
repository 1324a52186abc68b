"""Weighted draws in O(k log N): a sum tree over non-negative weights (AdaFL's attention scores, docs/algorithms.md §5).

:class:`SumTree` keeps the partial sums of ``N`` weights in a complete binary tree; :func:`weighted_draw` draws ``k``
distinct leaves by successive sampling (each draw proportional to the weights of the leaves not yet drawn: the law of
``torch.multinomial(w, k, replacement=False)``) in O(k log N) expected time, whatever ``N``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.engine.host import values

__all__ = ["SumTree", "weighted_draw"]


class SumTree:
    """Partial sums of ``[N]`` non-negative float64 weights (on the host).

    Level 0 holds the leaves (padded with zeros to a power of two), level ``j + 1`` the sums of level ``j``'s pairs.
    A parent is always recomputed as the sum of its two children, never moved by a difference, so the tree is a
    function of its leaves alone: a run resumed from its checkpointed weights rebuilds the very same tree.
    """

    def __init__(self, weights: Tensor) -> None:
        w = weights.detach().to("cpu", torch.float64).flatten()
        if bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
            raise ValueError("weights: a sum tree needs finite, non-negative weights")
        self.num_leaves = w.numel()
        size = 1 << max(0, (self.num_leaves - 1).bit_length())
        leaves = torch.zeros(size, dtype=torch.float64)
        leaves[: self.num_leaves] = w
        self.levels = [leaves]
        while self.levels[-1].numel() > 1:
            below = self.levels[-1]
            self.levels.append(below[0::2] + below[1::2])
        self.positive = values((w > 0).sum())  # host values: no scalar read (lfed.engine.host)

    @property
    def total(self) -> float:
        return values(self.levels[-1][0])

    def set(self, index: Tensor, new: Tensor) -> None:
        """Leaves ``index`` (distinct) take ``new``; their ancestors are recomputed from their children."""
        index = index.detach().to("cpu", torch.long)
        new = new.detach().to("cpu", torch.float64)
        old = self.levels[0][index]
        self.positive += values((new > 0).sum()) - values((old > 0).sum())
        self.levels[0][index] = new
        for j in range(1, len(self.levels)):
            index = torch.unique(index // 2)
            below = self.levels[j - 1]
            self.levels[j][index] = below[2 * index] + below[2 * index + 1]

    def descend(self, u: Tensor) -> Tensor:
        """``[m]`` the leaves at cumulative masses ``u`` (each in ``[0, total)``): the leaf ``i`` with
        ``Σ_{l<i} w_l <= u < Σ_{l<=i} w_l``, one vectorised step per level. A step never enters a zero subtree."""
        node = torch.zeros_like(u, dtype=torch.long)
        for j in range(len(self.levels) - 1, 0, -1):
            below = self.levels[j - 1]
            left = below[2 * node]
            right = below[2 * node + 1]
            go_right = (u >= left) & (right > 0)
            u = torch.where(go_right, u - left, u)
            node = 2 * node + go_right.long()
        return node


def weighted_draw(tree: SumTree, k: int, generator: torch.Generator, max_batches: int = 64) -> Tensor | None:
    """``[k]`` distinct leaves of ``tree``, in draw order, by successive sampling proportional to the weights.

    Successive sampling without replacement is sampling with replacement with each leaf kept at its first appearance:
    batches of ``max(2 m, 16)`` draws (``m`` still missing), uniform masses from ``generator`` descended through the
    tree. O(k log N) expected while no few leaves hold most of the mass; None when ``k`` exceeds the leaves of positive
    weight or ``max_batches`` batches did not find ``k`` (the caller then draws exactly over all ``N``).
    """
    if k > tree.positive:
        return None
    total = tree.total
    kept = torch.zeros(0, dtype=torch.long)
    for _ in range(max_batches):
        if kept.numel() >= k:
            return kept[:k]
        m = max(2 * (k - kept.numel()), 16)
        u = torch.rand(m, generator=generator, dtype=torch.float64) * total
        draws = tree.descend(u)
        values_, inverse = torch.unique(draws, return_inverse=True)  # each leaf's first position in the batch
        first = torch.full_like(values_, m).scatter_reduce(0, inverse, torch.arange(m), "amin")
        new = ~torch.isin(values_, kept)
        kept = torch.cat([kept, values_[new][first[new].argsort()]])
    return kept[:k] if kept.numel() >= k else None
