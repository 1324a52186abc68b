"""What a component declares for the asynchronous schedule (:mod:`lfed.core.asynchronous`), read there and nowhere else:
not base-class flags, since only that schedule reads them. No imports: every component may import it.

A component says whether it is defined asynchronously (updates computed on older models, a server step per buffer of
arrivals) with:

* ``asynchronous_ready = True`` in its class's own body (not inherited: a subclass computes something else and says
  so again);
* ``asynchronous_unready = "..."``: why a component of its kind is not, after its class name (a role's base class
  says it for its role; inherited);
* ``asynchronous_refusal(self, schedule) -> str | None``: a reason that depends on its settings (it may return
  :func:`declared_refusal`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["asynchronous_refusal", "declared_refusal"]


def declared_refusal(component: Any) -> str | None:
    """None when ``component``'s class itself declares ``asynchronous_ready = True``, else ``"<ClassName> <why>"``
    (its ``asynchronous_unready``, or "is not defined asynchronously yet")."""
    if type(component).__dict__.get("asynchronous_ready", False):
        return None
    why = getattr(component, "asynchronous_unready", "is not defined asynchronously yet")
    return f"{type(component).__name__} {why}"


def asynchronous_refusal(component: Any, schedule: Any) -> str | None:
    """Why ``component`` cannot run under ``schedule`` (an :class:`lfed.core.asynchronous.Asynchronous`), or None: its
    own ``asynchronous_refusal(schedule)`` when it has one, else :func:`declared_refusal`."""
    own = getattr(component, "asynchronous_refusal", None)
    return own(schedule) if callable(own) else declared_refusal(component)
