"""Byzantine robustness (docs/robustness.md): robust aggregation rules and the attacks that test them.

Both work on the cohort's stacked updates ``[K, P]`` inside the round, for every client at once:

* :mod:`lfed.robust.rules`: server combinations (``combination:``) that bound what a minority of arbitrary rows can do
  to the aggregate (coordinate-wise median, trimmed mean, Krum, Multi-Krum, Bulyan, geometric median, centered
  clipping, norm bounding) and the pre-aggregators that compose with any of them (bucketing, nearest-neighbour mixing).
* :mod:`lfed.robust.attacks`: the run's Byzantine clients (``attack:``), a seeded fixed set of them, and what they send:
  data poisoning that trains through the engine (label flipping) and model poisoning that rewrites their rows of the
  round's updates (sign flipping, Gaussian, scaling, A Little Is Enough, Inner Product Manipulation, min-max,
  min-sum, Mimic).
"""
