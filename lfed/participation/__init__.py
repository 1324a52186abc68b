"""Participation: who takes part in a step and how much work each does: cohort sizes and stragglers
(:mod:`~lfed.participation.participation`), fraction schedules and samplers (:mod:`~lfed.participation.sampling`), the
straggler model (:mod:`~lfed.participation.stragglers`), the simulated clock and availability
(:mod:`~lfed.participation.clock`), availability and device traces (:mod:`~lfed.participation.traces`) and synchronous
cohorts among the clients online (:mod:`~lfed.participation.availability`).
The names of 0.4's ``lfed.participation`` are exported here (imported on first use)."""

from lfed import _lazy_exports

#: 0.4's ``lfed.participation`` names, from their module now (imported on first use).
_LAZY = {
    "Participation": "lfed.participation.participation",
}

__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
