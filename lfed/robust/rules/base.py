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
from lfed.base.declaration import Declaration, Supports
from lfed.checks import integer
from lfed.engine.host import device_rows
from lfed.server.combination import ServerCombination

__all__ = ["RobustCombination", "expected_byzantine", "first_true", "krum_bounds", "krum_scores", "pairwise_sq_distances",
           "select_lowest", "sq_distances"]


#: The unit roundoff of float64 (the distances below are computed in float64 whatever the updates' dtype).
UNIT = 2.0 ** -53


def _gamma(n: int) -> float:
    """``γ_n = n u / (1 - n u)``: the relative error bound of a float64 sum or dot product of ``n`` terms, in any order."""
    return n * UNIT / (1 - n * UNIT)


def sq_distances(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(D [k, k], E [k, k])`` in float64: ``D_ij ≈ ||x_i - x_j||²`` from the Gram matrix (``||x_i||² + ||x_j||² -
    2⟨x_i, x_j⟩``, the updates upcast to float64, which is exact) and a bound ``E_ij`` on its rounding error:
    ``|D_ij - ||x_i - x_j||²| ≤ E_ij = 3 γ_{P+2} (ŝ_i + ŝ_j)`` with ``ŝ_i`` the computed ``||x_i||²`` and
    ``γ_n = n u / (1 - n u)``, ``u = 2⁻⁵³`` (each dot product of ``P`` terms errs by at most ``γ_P`` times the sum of
    its terms' magnitudes, in any summation order; the two additions add at most ``3u``). ``D_ii = E_ii = 0``; ``D ≥ 0``.
    ``E`` is what the rules' tie rule compares beyond (:func:`select_lowest`)."""
    k, p = x.shape
    sq = torch.zeros(k, dtype=torch.float64, device=x.device)
    gram = torch.zeros(k, k, dtype=torch.float64, device=x.device)
    step = max(1, 2 ** 24 // max(k, 1))  # columns at a time: no float64 copy of all of x
    for c in range(0, p, step):
        b = x[:, c:c + step].to(torch.float64)
        sq += (b * b).sum(1)
        gram += b @ b.T
    both = sq[:, None] + sq[None, :]
    d = (both - 2 * gram).clamp_min(0).fill_diagonal_(0)
    e = (3 * _gamma(p + 2) * both).fill_diagonal_(0)
    return d, e


def pairwise_sq_distances(x: Tensor) -> Tensor:
    """``D [k, k]``, ``D_ij = ||x_i - x_j||²`` (``x [k, P]``), from the Gram matrix in float64 (:func:`sq_distances`),
    in ``x``'s dtype; ``≥ 0``."""
    return sq_distances(x)[0].to(x.dtype)


def krum_scores(d: Tensor, neighbours: int) -> Tensor:
    """Krum's score of each row (Blanchard et al. 2017, §4): the sum of its ``neighbours`` smallest squared distances to the
    other rows (``d``: :func:`pairwise_sq_distances`; a row is not its own neighbour)."""
    k = d.shape[0]
    if neighbours <= 0:
        return d.new_zeros(k)
    others = d + torch.diag(d.new_full((k,), math.inf))
    return torch.topk(others, neighbours, dim=1, largest=False).values.sum(1)


def krum_bounds(d: Tensor, e: Tensor, neighbours: int) -> Tensor:
    """``β [k]``: ``|krum_scores(d) - s| ≤ β`` with ``s`` the scores of the exact distances, given ``|d - D| ≤ e``
    entrywise (:func:`sq_distances`; ``d`` may hold ``+∞`` for rows that left the set, ``e`` finite). The sum of the
    ``m`` smallest entries moves by at most the sum of the ``m`` largest errors among the entries that can be among the
    ``m`` smallest, exact or computed: those with ``d_ij - e_ij`` at most the ``m``-th smallest ``d_ij + e_ij``; plus
    the rounding of the sum of ``m`` terms."""
    k = d.shape[0]
    if neighbours <= 0:
        return d.new_zeros(k)
    self_inf = torch.diag(d.new_full((k,), math.inf))
    t = torch.topk(d + e + self_inf, neighbours, dim=1, largest=False).values[:, -1:]
    near = (d - e + self_inf) <= t
    worst = torch.where(near, e, torch.zeros_like(e)).max(1).values
    return neighbours * worst + 2 * _gamma(neighbours) * (krum_scores(d, neighbours) + neighbours * worst)


def select_lowest(s: Tensor, b: Tensor, m: int) -> Tensor:
    """``[..., k]`` bool: the ``m`` entries of lowest ``s`` along the last dimension (``0 < m ≤ k``), each ``s_i``
    known to ``± b_i`` (its rounding bound), ties to the lower index. Two entries are ordered by ``s`` only when their
    intervals ``[s_i - b_i, s_i + b_i]`` are apart; otherwise they count as tied. Entry ``i`` is surely kept when fewer
    than ``m`` others can be at or below it (``s_j - b_j ≤ s_i + b_i``), surely left out when ``m`` or more are surely
    below it (``s_j + b_j < s_i - b_i``); the rest fill the remaining places lowest index first. Exact ties (equal exact
    values) thus always go to the lower index, and with ``b = 0`` this is a stable sort's first ``m``. No device read."""
    lo, hi = s - b, s + b
    lo_sorted, hi_sorted = lo.sort(-1).values.contiguous(), hi.sort(-1).values.contiguous()
    could_below = torch.searchsorted(lo_sorted, hi.contiguous(), right=True) - 1  # the others with lo_j <= hi_i
    surely_below = torch.searchsorted(hi_sorted, lo.contiguous(), right=False)  # those with hi_j < lo_i
    kept = could_below < m
    tied = ~kept & (surely_below < m)
    room = m - kept.sum(-1, keepdim=True)
    return kept | (tied & (tied.cumsum(-1) <= room))


def first_true(mask: Tensor) -> Tensor:
    """The index of the first True of a ``[k]`` bool mask (0-dim; no device read)."""
    return torch.argmax(mask.to(torch.uint8))


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
    declares = Declaration(supports=Supports(
        asynchronous="is a robust rule over one round's cohort; it is not defined on a buffer of stale updates"))

    def __init__(self, f: int | None = None) -> None:
        super().__init__()
        if f is not None:
            integer("f", f, at_least=0, detail=" or None (the Byzantine clients the run's attack puts in a round)")
        self.f = f
        self._attack: Any = None  # the run's attack (check), for f = None
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

    def check_data(self, data: Any) -> None:
        """Refuse the run's data where the rule cannot use it (FLTrust needs a validation split); nothing by default."""

    def check(self, context) -> list[str]:
        """The data (:meth:`check_data`), then every planned cohort against :meth:`min_inputs`; warns of a weighting
        the rule does not read."""
        if context.data is not None:
            self.check_data(context.data)
        self._attack = (context.components or {}).get("attack")
        for k in sorted(set(context.cohort_sizes or ())) if self.takes_f else ():
            f = self.f_for(k)
            if k < self.min_inputs(f):
                raise ValueError(self._too_few(k, f, "a planned cohort of"))
        out = []
        beyond = self._beyond_f(context.cohort_sizes or ())
        if beyond:
            out.append(beyond)
        if not self.uses_weights and "weighting" in context.explicit:
            out.append(f"combination={self.name!r} does not weigh the updates by their aggregation weights, so weighting "
                       "has no effect (only which clients count matters)")
        return out

    def _beyond_f(self, cohort_sizes) -> str | None:
        """The warning when an explicit ``f`` is below the Byzantine updates the run's attack sends in a planned
        cohort: the rule then tolerates fewer than it meets, and its guarantee does not hold (a study beyond the
        breakdown point may want that, so it is said, not refused)."""
        if not self.takes_f or self.f is None or self._attack is None:
            return None
        for k in sorted(set(cohort_sizes)):
            b = expected_byzantine(self._attack, k)
            if b > self.f:
                how = (f"per_round: {self._attack.per_round}" if getattr(self._attack, "per_round", None) is not None
                       else f"fraction: {self._attack.fraction:g}, ⌈{self._attack.fraction:g} · {k}⌉")
                return (f"combination: {self.name} tolerates f = {self.f} Byzantine updates a round, but the attack "
                        f"({self._attack.name}, {how}) sends {b} in a planned cohort of {k}: beyond f the rule's "
                        f"guarantee does not hold (f: {b}, or f unset, holds the rule to the attack: it then needs "
                        f"{self.requirement()}, at least {self.min_inputs(b)} updates)")
        return None

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
