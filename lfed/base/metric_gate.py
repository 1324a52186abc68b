"""Which logged values a DP run may release: the metric gate (docs/privacy.md "Metrics under DP").

A DP run's guarantee covers what the accountant accounts, and post-processing of it: the noised releases (the
aggregate, the noised clipped count) and what the server computes on its own data (the test split, its validation
split). Every other metric read from the clients' data without noise (the training loss, the cohort's local
accuracy, the realised cohort size, the clients' held-out accuracies) is an unaccounted release.

A metric is *private* when its producer declares it so: a component's ``Releases(private_metrics=...)`` (names, or prefixes ending in
``*``, of what its ``report`` computes only from values a DP run releases privatized, or from server-held data) for
what a component reports, :attr:`lfed.core.run.FederatedRun.private_metrics` for the run's own (evaluation on server-held data,
the summary figures built from it). A metric nobody declares is unaccounted: a new metric cannot leak by omission.
A component that guards a run's metrics declares a ``metric_policy`` (DP-FedAvg; both are parts of the component's
declaration, ``Releases(private_metrics=..., metric_policy=...)``, :mod:`lfed.base.declaration`):

* ``drop`` (DP's default): only private metrics are logged;
* ``mark`` (``log_unaccounted: true``): the rest too, each renamed ``unaccounted/<name>``;
* no guard (a run without DP): every metric as it is.

The run applies the gate (:class:`MetricGate`) to every metric it logs, prints or writes to a summary, in one place
each: the round's metrics, the evaluation's, the end-of-run summary, the accuracy histogram.

Metrics renamed in 0.5 (:data:`RENAMED`) were logged under their old names too, for one version, as 0.5 promised;
0.6 logs only the new names. Where a user names a metric (a component's declared private metrics, a callback's
``monitor``, a sweep's ``metric.name``), an old name is refused before round 0 in one line naming the new one
(:func:`check_metric_name`); the rows an old checkpoint holds are read under the new names (:func:`canonical_name`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lfed.base.component import each_once
from lfed.base.declaration import declaration

__all__ = ["MODES", "RENAMED", "UNACCOUNTED", "MetricGate", "canonical_name", "check_metric_name", "matches"]

#: The marker of a metric logged although no accountant covers it (``log_unaccounted: true``).
UNACCOUNTED = "unaccounted/"
#: ``all``: no gate; ``mark``: unaccounted metrics renamed; ``drop``: unaccounted metrics not logged (strictest last).
MODES = ("all", "mark", "drop")
#: Metrics renamed in 0.5, old name -> new name (``_worst10pct`` as ``global/``, ``personal/`` and their ``_val`` forms
#: have always been named). 0.5 logged each under both names; 0.6 logs only the new one, and refuses the old where a
#: user names a metric (:func:`check_metric_name`).
RENAMED = {
    "client/acc_worst10": "client/acc_worst10pct",
    "client/perplexity_worst10": "client/perplexity_worst10pct",
}


def canonical_name(name: str) -> str:
    """``name``'s current name: the new name of a renamed metric (:data:`RENAMED`), else ``name``. For what an old
    checkpoint recorded (the end-of-run table's rows), not for what a user names (:func:`check_metric_name`)."""
    return RENAMED.get(name, name)


def check_metric_name(name: object, where: str) -> None:
    """Refuse a metric named by its 0.4 name (:data:`RENAMED`), alone or after a prefix (``unaccounted/``, a grid
    member's ``<name>/``), in one line naming ``where`` and the new name; anything else passes.

    Raises:
        ValueError: ``<where>: client/acc_worst10 is lfed 0.4's metric name, not logged since 0.6; it is
            client/acc_worst10pct now``.
    """
    if not isinstance(name, str):
        return
    for old, new in RENAMED.items():
        if name == old or name.endswith("/" + old):
            raise ValueError(f"{where}: {name} is lfed 0.4's metric name, not logged since 0.6; it is "
                             f"{name[:len(name) - len(old)]}{new} now")


def matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether ``name`` is one of ``patterns`` (an exact name, or a prefix ending in ``*``)."""
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)


@dataclass(frozen=True)
class MetricGate:
    """The gate (module docstring).

    Args:
        mode: One of :data:`MODES`.
        private: The private metrics' names or ``prefix*`` patterns.
    """

    mode: str = "all"
    private: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} is not one of {MODES}")
        for pattern in self.private:  # a component's declared private metrics, the run's own
            check_metric_name(pattern, "private_metrics")

    @classmethod
    def of(cls, components: Iterable[Any], declared: Iterable[str] = ()) -> MetricGate:
        """The gate of a run: the strictest policy of its ``components`` and every private metric they and the run
        (``declared``) declare."""
        said = [declaration(c).releases for c in each_once(components)]  # lfed.base.declaration
        mode = max((r.metric_policy or "all" for r in said), key=MODES.index, default="all")
        private = tuple(declared) + tuple(p for r in said for p in r.private_metrics)
        return cls(mode, private)

    @property
    def active(self) -> bool:
        return self.mode != "all"

    def is_private(self, name: str) -> bool:
        return matches(name, self.private)

    def name(self, name: str) -> str | None:
        """The name ``name`` is logged under: itself, ``unaccounted/<name>``, or None (not logged)."""
        if self.mode == "all" or self.is_private(name):
            return name
        return UNACCOUNTED + name if self.mode == "mark" else None

    def __call__(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """``metrics`` as the run may log them (their order kept): each under :meth:`name`, or not at all."""
        out = {}
        for key, value in metrics.items():
            shown = self.name(key)
            if shown is not None:
                out[shown] = value
        return out
