"""Bucketing (Karimireddy, He and Jaggi, ICLR 2022, Algorithm 1; docs/robustness.md §2.7)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.checks import integer
from lfed.rng import round_generator
from lfed.robust.rules.preaggregation import PreAggregator

__all__ = ["Bucketing"]


class Bucketing(PreAggregator):
    """A seeded random permutation ``π`` of the ``k`` counting updates, cut into ``⌈k/s⌉`` buckets of ``s`` (the last may
    hold fewer); ``y_j = mean of bucket j``; ``Δ = rule(y_1, ..., y_⌈k/s⌉)``. A bucket's weight is the sum of its
    members'. The permutation is drawn from ``(seed, round, "bucketing")`` on the host: the same on every backend.

    Args:
        rule: The rule fed the bucket means (a name or a ``RobustCombination``).
        bucket_size: ``s ≥ 1`` (the paper: 2).
        f: The rule's ``f`` (None: the attack's); the rule's requirement holds on ``⌈k/s⌉`` buckets.
    """

    name = "bucketing"

    def __init__(self, rule: Any = "median", bucket_size: int = 2, f: int | None = None) -> None:
        super().__init__(rule, f)
        self.bucket_size = integer("bucket_size", bucket_size, at_least=1)

    def hparams(self) -> dict:
        return {**super().hparams(), "bucket_size": self.bucket_size}

    def min_inputs(self, f: int) -> int:
        return self.bucket_size * (self.rule.min_inputs(f) - 1) + 1  # ⌈k/s⌉ ≥ the rule's

    def requirement(self) -> str:
        return f"⌈K/s⌉ buckets for {self.rule.name}'s {self.rule.requirement()}"

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, Tensor | None]:
        k, s = x.shape[0], self.bucket_size
        perm = torch.randperm(k, generator=round_generator(cohort.seed, cohort.round, "bucketing")).to(x.device)
        buckets = math.ceil(k / s)
        member = torch.empty(k, dtype=torch.long).to(x.device)
        member[perm] = torch.arange(k, device=x.device) // s  # the bucket of each row
        sums = x.new_zeros(buckets, x.shape[1]).index_add_(0, member, x)
        counts = torch.bincount(member, minlength=buckets).to(x.dtype)
        y, b = sums / counts[:, None], x.new_zeros(buckets).index_add_(0, member, a)
        delta, kept = self.rule.aggregate(y, b, f, cohort)
        return delta, (None if kept is None else kept.index_select(0, member))
