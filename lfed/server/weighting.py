"""Aggregation weights as a component of the round (docs/algorithms.md §3), and what partial work counts for.

:class:`AggregationWeights` turns a cohort into its ``[K]`` weights and its counting mask
(the clients whose work counts); the maths is in the pure functions of
:mod:`lfed.server.weight_formulas`. Three rules: :class:`SizeWeights` (FedAvg), :class:`UniformWeights`
and :class:`DWFedWeights`; each takes ``partial_work``: ``keep`` (FedProx), ``drop`` (FedAvg) or
``scale`` (EFL's ``T/s``, not renormalised).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lfed.base.component import Cohort, Component
from lfed.base.declaration import Declaration, Releases, Supports
from lfed.checks import one_of
from lfed.server.weight_formulas import PARTIAL_WORK, aggregation_weights, counting_mask

__all__ = ["AggregationWeights", "DWFedWeights", "PartialWork", "SizeWeights", "UniformWeights"]

PartialWork = Literal[PARTIAL_WORK]  # type: ignore[valid-type]


class AggregationWeights(Component):
    """Base class: the weights ``a_k`` of a round's cohort and whose work counts (docs/algorithms.md §3).

    Args:
        partial_work: What stragglers' partial work counts for: ``keep``, ``drop`` or ``scale``.
    """

    name = "size"
    rule = "size"

    @property
    def declares(self) -> Declaration:
        """Its kind's reason, naming the setting (a subclass that says nothing is refused asynchronously with it). A
        weighting where every counting client weighs the same, ``a_k = 1/|S|`` (:class:`UniformWeights`), which
        DP-FedAvg's bounded sensitivity needs, declares ``Supports(equal_weights=True)``."""
        return Declaration(supports=Supports(asynchronous=f"({self.name!r}) is not defined asynchronously yet; use size "
                                                          "or uniform"))

    def __init__(self, partial_work: PartialWork = "keep") -> None:
        super().__init__()
        self.partial_work = one_of("partial_work", partial_work, PARTIAL_WORK)

    def structure(self) -> dict:
        return {"partial_work": self.partial_work}

    def check(self, context) -> list[str]:
        if self.partial_work in ("scale", "drop") and "partial_work" in context.explicit and context.p_incomplete <= 0.0:
            return [f"partial_work={self.partial_work!r} only changes how incomplete clients count, but "
                    "p_incomplete=0 makes every active client complete its budget: it is the same as 'keep' "
                    "(set p_incomplete > 0 for a straggler model)"]
        return []

    def counting(self, cohort: Cohort) -> Tensor:
        """``[K]`` bool: the clients whose work counts this round (on the host, from :attr:`Cohort.host`)."""
        host = cohort.host_values()
        return counting_mask(host.steps_done, host.step_budget, self.partial_work)

    def weights(self, cohort: Cohort, client_label_counts: Tensor, population_label_counts: Tensor) -> Tensor:
        """``[K]`` float64 weights (0 for clients whose work does not count).

        Computed on the host from the cohort's host values (:attr:`Cohort.host`; the round gives the label
        counts on the host too), so the round's input checks read no device value (:mod:`lfed.engine.host`); the
        round moves the weights to the device. A subclass may return them on either.

        Warns :class:`~lfed.server.weight_formulas.DegenerateWeightsWarning` where a rule falls back.
        """
        host = cohort.host_values()
        return aggregation_weights(
            self.rule,
            num_examples=host.num_examples,
            steps_done=host.steps_done,
            step_budget=host.step_budget,
            partial_work=self.partial_work,
            client_label_counts=client_label_counts,
            population_label_counts=population_label_counts,
            dtype=torch.float64,
        )


class SizeWeights(AggregationWeights):
    """``a_k = n_k / Σ_j n_j`` over the counting clients (FedAvg)."""

    declares = Declaration(supports=Supports(asynchronous=True))


class UniformWeights(AggregationWeights):
    """``a_k = 1 / |S|`` over the counting clients (SCAFFOLD)."""

    name = rule = "uniform"
    declares = Declaration(supports=Supports(asynchronous=True, equal_weights=True))


class DWFedWeights(AggregationWeights):
    """DWFed's ISH weights from label counts (002 eqs. 7, 12, 13)."""

    name = rule = "dwfed"
    declares = Declaration(releases=Releases(values=(
        "DWFed's weights come from each client's label counts (its label distance to the population), un-noised",)))

    def check(self, context) -> list[str]:
        """DWFed's weights are computed from the clients' label counts: refuse targets that are not class labels."""
        if context.data is not None:
            context.data.require_labels("weighting='dwfed' (label-count weights)")
            if context.data.population_label_counts() is None:
                raise ValueError("weighting='dwfed' weighs each client by its label distance to the population's label "
                                 "counts, which a population made per client (data.lazy) does not count (a pass over "
                                 "every example); use data.lazy: false, or another weighting")
        return super().check(context)
