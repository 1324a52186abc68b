"""What a component declares of itself: one frozen object, read by the round, the run and its neighbours.

A component says what it releases, what it needs and what it supports in one :class:`Declaration`, as a class
attribute, or as a property when it depends on the component's own settings (SCAFFOLD releases its control variate
unless it clips and noises it)::

    class MyRule(ClientRule):
        declares = Declaration(needs=Needs(start_loss=True))

Everything in lfed reads it through one accessor, :func:`declaration` (which also reads lfed 0.5's flags, with one
``FutureWarning`` per class: :mod:`lfed.base.legacy`). Nobody names a component: DP-FedAvg asks the sampler whether it
draws Poisson cohorts, the round whether some component needs the start losses, the asynchronous schedule whether each
component is defined asynchronously. No imports from lfed: every component may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["METRIC_POLICIES", "Declaration", "Needs", "Releases", "Supports", "asynchronous_reason", "declaration"]

#: A component's guard on the run's metrics (:mod:`lfed.base.metric_gate`): ``None`` no guard, ``drop`` only private
#: metrics are logged, ``mark`` the rest too as ``unaccounted/<name>``.
METRIC_POLICIES = (None, "all", "mark", "drop")


def _strings(owner: str, value: Any) -> tuple[str, ...]:
    value = (value,) if isinstance(value, str) else tuple(value)
    if not all(isinstance(v, str) for v in value):
        raise ValueError(f"{owner}: a tuple of strings, got {value!r}")
    return value


@dataclass(frozen=True)
class Releases:
    """What a component sends beyond the round's update, and what of it a DP run may show.

    Attributes:
        values: Every value computed from the clients' data that leaves them beyond the update (to the server, to
            other clients, into the global model), unclipped or un-noised: one clause each. A DP run refuses each before
            round 0 (:mod:`lfed.privacy.releases`). State that stays on its client is no release.
        dp_shares: The noise multipliers of the component's own clipped and noised releases (DP-SCAFFOLD's control
            updates), which DP-FedAvg's accountant composes with the update's.
        every_round: The combination releases a value every round, also when no client counts (DP's noise): the round
            then runs it anyway.
        private_metrics: Names (or prefixes ending in ``*``) of what :meth:`~lfed.base.component.Component.report`
            computes from privatized releases or server-held data only: a DP run logs them (:mod:`lfed.base.metric_gate`).
        metric_policy: The component guards the run's metrics: ``drop`` or ``mark`` (``None``: no guard).
    """

    values: tuple[str, ...] = ()
    dp_shares: tuple[float, ...] = ()
    every_round: bool = False
    private_metrics: tuple[str, ...] = ()
    metric_policy: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", _strings("Releases.values", self.values))
        object.__setattr__(self, "private_metrics", _strings("Releases.private_metrics", self.private_metrics))
        shares = (self.dp_shares,) if isinstance(self.dp_shares, (int, float)) else tuple(self.dp_shares)
        if not all(isinstance(z, (int, float)) and not isinstance(z, bool) and z > 0 for z in shares):
            raise ValueError(f"Releases.dp_shares: noise multipliers > 0, got {self.dp_shares!r}")
        object.__setattr__(self, "dp_shares", tuple(float(z) for z in shares))
        if self.metric_policy not in METRIC_POLICIES:
            raise ValueError(f"Releases.metric_policy: one of {METRIC_POLICIES}, got {self.metric_policy!r}")
        if not isinstance(self.every_round, bool):
            raise ValueError(f"Releases.every_round: true or false, got {self.every_round!r}")


@dataclass(frozen=True)
class Needs:
    """What a component needs the round to compute for it.

    Attributes:
        history: It reads :attr:`~lfed.base.component.Cohort.previous_update` and
            :attr:`~lfed.base.component.Cohort.global_change` (the round then keeps the update history).
        start_loss: It reads :attr:`~lfed.base.component.Cohort.start_loss`, each cohort client's loss under the round's
            model (one more forward pass over the cohort's examples).
    """

    history: bool = False
    start_loss: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            if not isinstance(getattr(self, f.name), bool):
                raise ValueError(f"Needs.{f.name}: true or false, got {getattr(self, f.name)!r}")


@dataclass(frozen=True)
class Supports:
    """What a component is or supports, which its neighbours may require.

    Attributes:
        asynchronous: ``True``: it is defined asynchronously (on stale updates, a server step per buffer of arrivals);
            a string: why a component of its kind is not, after its class name; ``None``: not said. ``True`` is not
            inherited: a subclass may compute something else and says so again (:func:`asynchronous_reason`).
        personalized: Each client has its own model (:meth:`lfed.client.ClientRule.personal_rows`), evaluated as
            ``personal/*``.
        poisson: A sampler that draws Poisson cohorts (each client independently), as DP-FedAvg's accountant needs.
        equal_weights: A weighting that gives every counting client the same weight, as DP-FedAvg's sensitivity needs.
        exact: A channel that delivers every update and the combined update exactly (no compression, no residual),
            as DP-FedAvg's clipping needs (``None``: not said, taken as not exact).
    """

    asynchronous: bool | str | None = None
    personalized: bool = False
    poisson: bool = False
    equal_weights: bool = False
    exact: bool | None = None

    def __post_init__(self) -> None:
        if self.asynchronous is not None and not isinstance(self.asynchronous, (bool, str)):
            raise ValueError(f"Supports.asynchronous: True, a reason (a string) or None, got {self.asynchronous!r}")
        for name in ("personalized", "poisson", "equal_weights"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Supports.{name}: true or false, got {getattr(self, name)!r}")
        if self.exact is not None and not isinstance(self.exact, bool):
            raise ValueError(f"Supports.exact: true, false or None, got {self.exact!r}")


@dataclass(frozen=True)
class Declaration:
    """What a component releases, needs and supports (module docstring); every part optional."""

    releases: Releases = field(default_factory=Releases)
    needs: Needs = field(default_factory=Needs)
    supports: Supports = field(default_factory=Supports)

    def __post_init__(self) -> None:
        for name, kind in (("releases", Releases), ("needs", Needs), ("supports", Supports)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"Declaration.{name}: a {kind.__name__}(...), got {getattr(self, name)!r}")


#: What a component that declares nothing declares.
NOTHING = Declaration()


def declaration(component: Any) -> Declaration:
    """What ``component`` declares: its ``declares`` (a class attribute or a property), else nothing; lfed 0.5's
    flags (``needs_start_loss = True``, ...) are read too, with one ``FutureWarning`` per class
    (:mod:`lfed.base.legacy`)."""
    from lfed.base.legacy import legacy_declaration

    declared = getattr(component, "declares", None)
    if declared is not None and not isinstance(declared, Declaration):
        raise ValueError(f"{type(component).__name__}.declares: a lfed.base.declaration.Declaration, got {declared!r}")
    return legacy_declaration(component, declared or NOTHING)


def _said_by(klass: type, component: Any) -> Declaration | None:
    """What ``klass``'s own body declares (a property evaluated on ``component``), or None."""
    value = klass.__dict__.get("declares")
    if isinstance(value, property):
        value = value.__get__(component, type(component))
    return value if isinstance(value, Declaration) else None


def asynchronous_reason(component: Any) -> str | None:
    """None when ``component``'s own class declares it is defined asynchronously (``Supports(asynchronous=True)``, not
    inherited), else ``"<ClassName> <why>"``: the first reason its declaration or its classes' give, or "is not
    defined asynchronously yet"."""
    from lfed.base.legacy import legacy_asynchronous

    cls = type(component)
    own = "declares" in cls.__dict__
    said = declaration(component).supports.asynchronous
    legacy = legacy_asynchronous(cls)  # 0.5's asynchronous_ready / asynchronous_unready
    if legacy is True or (own and said is True):
        return None
    why = said if isinstance(said, str) else legacy if isinstance(legacy, str) else None
    for klass in cls.__mro__[1:]:
        if why is not None:
            break
        d = _said_by(klass, component)
        if d is not None and isinstance(d.supports.asynchronous, str):
            why = d.supports.asynchronous
    return f"{cls.__name__} {why or 'is not defined asynchronously yet'}"
