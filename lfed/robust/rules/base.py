"""What every robust rule shares (docs/robustness.md §2): the counting rows, the number ``f`` of Byzantine updates the rule
is asked to tolerate and its requirement on ``K``, and which clients a selecting rule kept.

A :class:`RobustCombination` is a :class:`~lfed.server.combination.ServerCombination` whose maths is one method,
:meth:`RobustCombination.aggregate`, on the ``k`` counting rows ``x [k, P]`` and their weights ``a [k]``; it returns
``Δ [P]`` and, for a rule that selects rows (Krum, Multi-Krum, Bulyan), the ``[k]`` bool mask of the rows it kept.
The pre-aggregators (:class:`~lfed.robust.rules.bucketing.Bucketing`,
:class:`~lfed.robust.rules.nnm.NearestNeighborMixing`) call another rule's :meth:`aggregate` on the rows they make.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort
from lfed.checks import integer
from lfed.engine.host import device_rows
from lfed.server.combination import ServerCombination

__all__ = ["RobustCombination", "expected_byzantine", "krum_scores", "pairwise_sq_distances"]


def pairwise_sq_distances(x: Tensor) -> Tensor:
    """``D [k, k]``, ``D_ij = ||x_i - x_j||²`` (``x [k, P]``), from the Gram matrix (one ``[k, P] @ [P, k]``); ``≥ 0``."""
    sq = (x * x).sum(1)
    d = sq[:, None] + sq[None, :] - 2 * (x @ x.T)
    d = d.clamp_min(0)
    return d.fill_diagonal_(0)


def krum_scores(d: Tensor, neighbours: int) -> Tensor:
    """Krum's score of each row (Blanchard et al. 2017, §4): the sum of its ``neighbours`` smallest squared distances to the
    other rows (``d``: :func:`pairwise_sq_distances`; a row is not its own neighbour)."""
    k = d.shape[0]
    if neighbours <= 0:
        return d.new_zeros(k)
    others = d + torch.diag(d.new_full((k,), math.inf))
    return torch.topk(others, neighbours, dim=1, largest=False).values.sum(1)


def expected_byzantine(attack: Any, cohort_size: int) -> int:
    """The Byzantine updates a round of ``cohort_size`` clients holds by the run's attack: its ``per_round``, else
    ``⌈fraction · K⌉`` (0 without an attack). A rule's default ``f``."""
    if attack is None:
        return 0
    per_round = getattr(attack, "per_round", None)
    if per_round is not None:
        return min(int(per_round), cohort_size)
    return math.ceil(float(getattr(attack, "fraction", 0.0)) * cohort_size - 1e-9)


class RobustCombination(ServerCombination):
    """Base of the robust rules: :meth:`combine` gives :meth:`aggregate` the counting rows and reports what it kept.

    Args:
        f: The number of Byzantine updates the rule tolerates in a round (for rules that take one; :attr:`takes_f`).
            None: the run's attack's (its ``per_round``, else ``⌈fraction · K⌉`` of each round's planned cohort
            ``K``; 0 without an attack).
    """

    name = "robust"
    #: Whether the rule takes ``f`` (Krum, median, ...); the geometric median, centered clipping and norm bounding do not.
    takes_f: bool = True
    #: Whether the rule reads the aggregation weights ``a_k`` (otherwise a weighting the user set has no effect: warned).
    uses_weights: bool = False
    asynchronous_ready = False
    asynchronous_unready = "is a robust rule over one round's cohort; it is not defined on a buffer of stale updates"

    def __init__(self, f: int | None = None) -> None:
        super().__init__()
        if f is not None:
            integer("f", f, at_least=0, detail=" or None (the Byzantine clients the run's attack puts in a round)")
        self.f = f
        self._attack: Any = None  # the run's attack (prepare_run), for f = None
        self._kept: tuple[Tensor, Tensor] | None = None  # (kept [k] bool, counting rows [k]) of the last round
        self._last: tuple[Tensor, Tensor] | None = None  # (the counting clients' ids [k], kept [k]) of the last round

    # ------------------------------------------------------------------ what a rule defines
    def min_inputs(self, f: int) -> int:
        """The fewest counting updates the rule is defined on with ``f`` Byzantine ones (Krum: ``2f + 3``)."""
        return 2 * f + 1

    def requirement(self) -> str:
        """The requirement of :meth:`min_inputs` as the paper writes it (``"K > 2f + 2"``)."""
        return "K > 2f"

    def aggregate(self, x: Tensor, a: Tensor, f: int, cohort: Cohort) -> tuple[Tensor, Tensor | None]:
        """``(Δ [P], kept [k] bool or None)`` from the counting rows ``x [k, P]`` and their weights ``a [k]``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the run
    def f_for(self, cohort_size: int) -> int:
        """The ``f`` of a round of ``cohort_size`` planned clients (:attr:`f`, else the attack's)."""
        if not self.takes_f:
            return 0
        return self.f if self.f is not None else expected_byzantine(self._attack, cohort_size)

    def hparams(self) -> dict:
        return {"f": self.f} if self.takes_f and self.f is not None else {}

    def prepare_run(self, context) -> None:
        self._attack = (context.components or {}).get("attack")
        if not self.takes_f:
            return
        for k in sorted(set(context.cohort_sizes or ())):
            f = self.f_for(k)
            if k < self.min_inputs(f):
                raise ValueError(self._too_few(k, f, "a planned cohort of"))

    def composition_warnings(self, context) -> list[str]:
        if not self.uses_weights and "weighting" in context.explicit:
            return [f"combination={self.name!r} does not weigh the updates by their aggregation weights, so weighting "
                    "has no effect (only which clients count matters)"]
        return []

    def _too_few(self, k: int, f: int, what: str) -> str:
        return (f"combination: {self.name} needs {self.requirement()} (at least {self.min_inputs(f)} updates with f = {f}), "
                f"but {what} {k} clients; sample more clients per round (fraction) or give a smaller f")

    def combine(self, updates: Tensor, weights: Tensor, cohort: Cohort) -> tuple[Tensor, None]:
        host = cohort.host_values()
        rows = device_rows(host.counting, updates.device)
        x = updates.index_select(0, rows)
        a = weights.to(updates.dtype).index_select(0, rows)
        f = self.f_for(int(cohort.expected_size or len(host.clients)))
        if x.shape[0] < self.min_inputs(f):
            raise ValueError(f"round {cohort.round}: " + self._too_few(x.shape[0], f, "the round's work counts for"))
        delta, kept = self.aggregate(x, a, f, cohort)
        self._kept = None if kept is None else (kept, rows)
        return delta, None

    @property
    def last_kept(self) -> Tensor | None:
        """The ids of the clients a selecting rule kept in the last round (on the device; None for a rule that keeps
        all): Krum's choice, for a callback (``module.combination.last_kept``) or a notebook."""
        return None if self._last is None else self._last[0][self._last[1]]

    def report(self, cohort: Cohort) -> dict[str, Tensor]:
        """``robust/kept``: the counting updates a selecting rule kept; ``robust/byzantine_kept``: how many of them came
        from Byzantine clients (with an attack)."""
        if self._kept is None:
            return {}
        kept, rows = self._kept
        self._kept = None
        self._last = (cohort.clients.index_select(0, rows), kept)  # read as last_kept, if ever: no device read here
        out = {"robust/kept": kept.sum().to(torch.float32)}
        byzantine = getattr(cohort, "byzantine", None)
        if byzantine is not None:
            out["robust/byzantine_kept"] = (kept & byzantine.index_select(0, rows)).sum().to(torch.float32)
        return out
