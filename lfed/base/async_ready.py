"""What a component declares for the asynchronous schedule (:mod:`lfed.core.asynchronous`), read there and nowhere else.

A component says whether it is defined asynchronously (updates computed on older models, a server step per buffer of
arrivals) in its declaration (:mod:`lfed.base.declaration`):

* ``declares = Declaration(supports=Supports(asynchronous=True))`` in its class's own body (not inherited: a subclass
  computes something else and says so again);
* ``Supports(asynchronous="...")``: why a component of its kind is not, after its class name (a role's base class
  says it for its role; inherited);
* a reason that depends on the run's other settings (a compressing channel under FedAsync's mixing) is refused in the
  component's own :meth:`~lfed.base.component.Component.check`.

lfed 0.5's spellings (``asynchronous_ready``, ``asynchronous_unready``, a method ``asynchronous_refusal(schedule)``) are
still read, with a ``FutureWarning`` (:mod:`lfed.base.legacy`).
"""

from __future__ import annotations

from typing import Any

from lfed.base.declaration import asynchronous_reason

__all__ = ["asynchronous_refusal", "declared_refusal"]


def declared_refusal(component: Any) -> str | None:
    """None when ``component``'s class itself declares ``Supports(asynchronous=True)``, else ``"<ClassName> <why>"``
    (:func:`lfed.base.declaration.asynchronous_reason`)."""
    return asynchronous_reason(component)


def asynchronous_refusal(component: Any, schedule: Any) -> str | None:
    """Why ``component`` cannot run under ``schedule`` (an :class:`lfed.core.asynchronous.Asynchronous`), or None: its
    declaration's (:func:`declared_refusal`); a component written for lfed 0.5 with its own method
    ``asynchronous_refusal(schedule)`` is asked that instead."""
    from lfed.base.legacy import legacy_hooks

    if "asynchronous_refusal" in legacy_hooks(component):
        return component.asynchronous_refusal(schedule)
    return declared_refusal(component)
