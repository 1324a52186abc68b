"""System heterogeneity: how many local steps each sampled client completes.

docs/algorithms.md §6, after EFL (004 §3-§4): per sampled client and round a completed step
count ``s_k ∈ {0..T_k}``: inactive (``s_k = 0``) with probability ``p_inactive``,
incomplete (``s_k ~ U{1..T_k-1}``) with probability ``p_incomplete``, else
complete (``s_k = T_k``). What happens to partial work is the aggregation's
choice (docs/algorithms.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lfed.checks import number

__all__ = ["Stragglers"]


def _check_probability(name: str, value: object) -> float:
    return number(name, value, at_least=0, at_most=1, detail=" (a probability)")


@dataclass
class Stragglers:
    """Draw completed local step counts for a cohort (docs/algorithms.md §6).

    Each client independently: with probability ``p_inactive`` it is inactive
    (``s = 0``); with probability ``p_incomplete`` it is incomplete and completes
    ``s ~ U{1..T-1}`` steps; otherwise it completes its budget ``T``. A client
    whose budget is ``T = 1`` cannot be incomplete (``{1..0}`` is empty): when it
    draws "incomplete" it completes its one step, so for such clients the
    incomplete probability folds into "complete". A budget of 0 always gives 0.

    Args:
        p_inactive: Probability of being inactive, in ``[0, 1]``.
        p_incomplete: Probability of being incomplete, in ``[0, 1]``.

    Raises:
        ValueError: If either is outside ``[0, 1]`` or their sum exceeds 1.
    """

    p_inactive: float = 0.0
    p_incomplete: float = 0.0

    def __post_init__(self) -> None:
        self.p_inactive = _check_probability("p_inactive", self.p_inactive)
        self.p_incomplete = _check_probability("p_incomplete", self.p_incomplete)
        if self.p_inactive + self.p_incomplete > 1.0 + 1e-12:
            raise ValueError(
                f"p_inactive + p_incomplete must be <= 1, got p_inactive={self.p_inactive} + "
                f"p_incomplete={self.p_incomplete} = {self.p_inactive + self.p_incomplete}"
            )

    @property
    def enabled(self) -> bool:
        """Whether any client can straggle."""
        return self.p_inactive > 0.0 or self.p_incomplete > 0.0

    def draw(self, step_budget: Tensor, generator: torch.Generator) -> Tensor:
        """Completed steps ``s_k`` for budgets ``T_k``, all clients at once.

        Consumes exactly two uniform draws per client when enabled (so the
        result for a given generator state depends only on the budgets) and
        none when both probabilities are 0.

        Args:
            step_budget: ``[K]`` integer budgets ``T_k >= 0``.
            generator: Source of randomness on ``step_budget``'s device, e.g.
                ``round_generator(seed, round, "stragglers", device)``.

        Returns:
            ``[K]`` completed steps, same dtype and device as ``step_budget``;
            exactly a copy of ``step_budget`` when both probabilities are 0.

        Raises:
            ValueError: If ``step_budget`` is not a 1-D integer tensor of
                non-negative values.
        """
        if not isinstance(step_budget, Tensor) or step_budget.ndim != 1:
            raise ValueError(f"step_budget must be a 1-D tensor, got {step_budget!r}")
        dtype = step_budget.dtype
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise ValueError(f"step_budget must be an integer tensor, got dtype {step_budget.dtype}")
        if (step_budget < 0).any().tolist():  # a host tensor in a round (lfed.engine.host): no device read
            raise ValueError(f"step_budget must be >= 0, got {step_budget.tolist()}")
        if not self.enabled:
            return step_budget.clone()
        budget = step_budget
        shape, device = budget.shape, budget.device
        u = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
        v = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
        inactive = u < self.p_inactive
        incomplete = ~inactive & (u < self.p_inactive + self.p_incomplete) & (budget > 1)
        # U{1..T-1}: 1 + floor(v * (T - 1)) with v in [0, 1); the clamp guards float rounding.
        partial = 1 + torch.floor(v * (budget - 1).to(torch.float64)).to(budget.dtype)
        partial = torch.minimum(partial, budget - 1)
        steps = torch.where(incomplete, partial, budget)
        return torch.where(inactive, torch.zeros_like(budget), steps)

    def __repr__(self) -> str:
        return f"Stragglers(p_inactive={self.p_inactive}, p_incomplete={self.p_incomplete})"
