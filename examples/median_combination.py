"""A user's own server combination, kept outside lfed: the coordinate-wise median of the updates.

Not part of the package: it shows that a component written in a user's own file plugs into
``lfed fit`` by ``class_path`` (docs/extending.md). Put this folder on ``PYTHONPATH`` and write::

    model:
      combination:
        class_path: median_combination.CoordinateMedian

The median of each coordinate over the clients whose work counts is robust to a minority of
outlying (or malicious) updates (Yin et al. 2018); it ignores the aggregation weights. With an
even number of updates a coordinate's median is the mean of its two middle values.
"""

from __future__ import annotations

from torch import Tensor

from lfed import Cohort
from lfed.server import ServerCombination


class CoordinateMedian(ServerCombination):
    """``Δ_i = median_{k counting} Δ_{k,i}`` for every coordinate ``i``."""

    name = "median"

    def combine(self, updates: Tensor, weights: Tensor, cohort: Cohort) -> tuple[Tensor, None]:
        ordered = updates[cohort.counting].sort(dim=0).values
        k = ordered.shape[0]
        return (ordered[(k - 1) // 2] + ordered[k // 2]) / 2, None
