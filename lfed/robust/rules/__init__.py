"""Robust aggregation rules as server combinations (docs/robustness.md §2); one rule per file."""

from lfed.robust.rules.base import RobustCombination, krum_scores, pairwise_sq_distances
from lfed.robust.rules.bucketing import Bucketing
from lfed.robust.rules.bulyan import Bulyan
from lfed.robust.rules.centered_clipping import CenteredClipping
from lfed.robust.rules.fltrust import FLTrust
from lfed.robust.rules.geometric_median import GeometricMedian
from lfed.robust.rules.krum import Krum, MultiKrum
from lfed.robust.rules.median import CoordinateMedian, TrimmedMean
from lfed.robust.rules.nnm import NearestNeighborMixing
from lfed.robust.rules.norm_bound import NormBound

__all__ = ["Bucketing", "Bulyan", "CenteredClipping", "CoordinateMedian", "FLTrust", "GeometricMedian", "Krum", "MultiKrum",
           "NearestNeighborMixing", "NormBound", "RobustCombination", "TrimmedMean", "krum_scores",
           "pairwise_sq_distances"]
