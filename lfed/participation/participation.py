"""Who takes part in a round and how much work each does (docs/algorithms.md §5 fraction, §6 stragglers).

:class:`Participation` is the round's participation component: the fraction schedule gives the
cohort size ``K_t = cohort_size(γ_t, N)`` and the straggler model each sampled client's completed
steps ``s_k``. Which clients are drawn is the sampler's business (:mod:`lfed.participation.sampling`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lfed.base.component import Component
from lfed.base.declaration import Declaration, Supports
from lfed.participation.sampling import FractionSchedule, as_schedule, cohort_size
from lfed.participation.stragglers import Stragglers

__all__ = ["Participation"]


class Participation(Component):
    """Cohort size per round and completed local steps per client.

    Args:
        fraction: Participation fraction ``C`` in (0, 1] or a :class:`~lfed.participation.sampling.FractionSchedule`.
        p_inactive: Probability that a sampled client does no work.
        p_incomplete: Probability that a sampled client stops early (``s ~ U{1..T-1}``).
    """

    name = "participation"
    # the cohort size is not used asynchronously (concurrency and buffer are): a warning
    declares = Declaration(supports=Supports(asynchronous=True))

    def __init__(self, fraction: float | FractionSchedule = 0.1, p_inactive: float = 0.0, p_incomplete: float = 0.0) -> None:
        super().__init__()
        if p_inactive >= 1.0:
            raise ValueError("p_inactive: 1.0 makes every sampled client inactive, so no round ever changes the model; use < 1")
        self.fraction = as_schedule(fraction)
        self.stragglers = Stragglers(p_inactive, p_incomplete)

    def hparams(self) -> dict:
        return {"fraction": repr(self.fraction), "p_inactive": self.stragglers.p_inactive,
                "p_incomplete": self.stragglers.p_incomplete}

    def check(self, context) -> list[str]:
        """A fraction so small that ``C * N`` rounds to no client: such a round samples one client (docs/algorithms.md §5's
        ``max(1, .)``), not the fraction asked for; said once, with the first such round."""
        N = context.num_clients
        if N is None or context.total_rounds is None or context.total_rounds < 1:
            return []
        for r in range(context.total_rounds):
            f = self.fraction(r, context.total_rounds)
            if f * N < 0.5:
                return [f"fraction: {f:g} of {N} clients is {f * N:.2g} clients a round, so round {r} samples 1 client "
                        f"(a round trains at least one): a share of {1 / N:.3g}, not {f:g}"]
        return []

    def cohort_size(self, round: int, total_rounds: int | None, num_clients: int) -> int:
        """``K_t`` of round ``round`` (docs/algorithms.md §5)."""
        return cohort_size(self.fraction(round, total_rounds), num_clients)

    def steps(self, step_budget: Tensor, generator: torch.Generator) -> Tensor:
        """Completed steps ``s_k`` for budgets ``T_k`` (docs/algorithms.md §6), on ``step_budget``'s device."""
        return self.stragglers.draw(step_budget.cpu(), generator).to(step_budget.device)
