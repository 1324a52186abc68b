"""lfed 0.5's spellings of the component contract, read for one release (0.6) with one ``FutureWarning`` per class.

0.5 had fifteen flags (``uses_history``, ``needs_start_loss``, ``personalized``, ``releases``, ...) and three check
hooks (``prepare_run``, ``check_start``, ``composition_warnings``); 0.6 has one declaration
(:class:`lfed.base.declaration.Declaration`) and one hook, :meth:`lfed.base.component.Component.check`. A component
written for 0.5 still runs: its flags are read into its declaration (:func:`legacy_declaration`) and its hooks are
called around ``check`` (:func:`lfed.base.component.check_components`), in 0.5's order. The first time lfed meets such
a class it warns once, naming every old spelling the class uses and its new one. 0.7 removes this module.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

__all__ = ["FLAGS", "HOOKS", "legacy_asynchronous", "legacy_declaration", "legacy_hooks"]

#: 0.5's flag -> (the declaration's part, its field).
FLAGS = {
    "uses_history": ("needs", "history"),
    "needs_start_loss": ("needs", "start_loss"),
    "personalized": ("supports", "personalized"),
    "releases": ("releases", "values"),
    "dp_shares": ("releases", "dp_shares"),
    "releases_every_round": ("releases", "every_round"),
    "private_metrics": ("releases", "private_metrics"),
    "metric_policy": ("releases", "metric_policy"),
    "poisson": ("supports", "poisson"),
    "equal_weights": ("supports", "equal_weights"),
    "exact": ("supports", "exact"),
    "asynchronous_ready": ("supports", "asynchronous"),
    "asynchronous_unready": ("supports", "asynchronous"),
}
_PART = {"needs": "Needs", "releases": "Releases", "supports": "Supports"}
#: 0.5's check hooks and what replaces each.
HOOKS = {
    "check_start": "check(self, context), the data as context.data",
    "prepare_run": "check(self, context)",
    "composition_warnings": "check(self, context), returning the warnings",
    "asynchronous_refusal": "declares = Declaration(supports=Supports(asynchronous='<why not>')), or raise in check(self, context)",
}
_WARNED: set[type] = set()


def _is_base(klass: type) -> bool:
    """Whether ``klass`` is lfed's ``Component``, torch's ``nn.Module`` (or another torch class) or ``object``: the
    classes whose members are no 0.5 spelling (this module imports nothing of lfed: every module may import it)."""
    return klass is object or klass.__module__.startswith("torch.") or (
        klass.__module__ == "lfed.base.component" and klass.__name__ == "Component")


def _spelling(name: str, value: Any) -> str:
    part, key = FLAGS[name]
    if name == "asynchronous_unready":
        shown = "'<why not>'"
    elif isinstance(value, bool):
        shown = "True"
    elif isinstance(value, str) or value is None:
        shown = repr(value)
    else:
        shown = "(...)"
    return f"declare it as declares = Declaration({part}={_PART[part]}({key}={shown}))"


def _class_scan(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(flags, hooks) of 0.5 that ``cls``'s own bodies (its MRO, lfed's bases aside) spell; kept per class (the round
    asks every step, and a class body does not change)."""
    said = _SCANNED.get(cls)
    if said is None:
        flags: list[str] = []
        hooks: list[str] = []
        for klass in cls.__mro__:
            if _is_base(klass):
                continue
            flags += [n for n in FLAGS if n in klass.__dict__ and n not in flags]
            hooks += [n for n in HOOKS if n in klass.__dict__ and n not in hooks]
        said = _SCANNED[cls] = (tuple(flags), tuple(hooks))
    return said


_SCANNED: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _scan(component: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(flags, hooks) of 0.5 that ``component``'s class (or, for flags, the instance) spells; warned once per class."""
    cls = type(component)
    class_flags, class_hooks = _class_scan(cls)
    flags, hooks = list(class_flags), list(class_hooks)
    own = getattr(component, "__dict__", {})
    flags += [n for n in FLAGS if n in own and n not in flags]
    if (flags or hooks) and cls not in _WARNED:
        _WARNED.add(cls)
        lines = [f"{cls.__name__}.{n}: lfed 0.5's flag, deprecated in 0.6: {_spelling(n, getattr(component, n, None))}"
                 for n in flags]
        lines += [f"{cls.__name__}.{n}: lfed 0.5's check hook, deprecated in 0.6: write {HOOKS[n]}" for n in hooks]
        warnings.warn("; ".join(lines) + " (docs/extending.md)", FutureWarning, stacklevel=4)
    return tuple(flags), tuple(hooks)


def legacy_hooks(component: Any) -> tuple[str, ...]:
    """The 0.5 hooks ``component``'s class defines (warned once per class)."""
    return _scan(component)[1]


def legacy_asynchronous(cls: type) -> bool | str | None:
    """0.5's asynchronous declaration of ``cls``: True when its own body says ``asynchronous_ready = True``; else the
    first ``asynchronous_unready`` of its classes; else None."""
    if cls.__dict__.get("asynchronous_ready", False):
        return True
    for klass in cls.__mro__:
        if not _is_base(klass) and isinstance(klass.__dict__.get("asynchronous_unready"), str):
            return klass.__dict__["asynchronous_unready"]
    return None


def legacy_declaration(component: Any, declared: Any) -> Any:
    """``declared`` (a :class:`lfed.base.declaration.Declaration`) with the 0.5 flags ``component`` spells read into it
    (none: ``declared`` itself)."""
    flags = _scan(component)[0]
    if not flags:
        return declared
    parts: dict[str, dict[str, Any]] = {"releases": {}, "needs": {}, "supports": {}}
    for name in flags:
        if name in ("asynchronous_ready", "asynchronous_unready"):
            continue
        value = getattr(component, name)
        part, key = FLAGS[name]
        parts[part][key] = bool(value) if key in ("history", "start_loss", "personalized", "poisson", "equal_weights",
                                                  "every_round") else value
    if "asynchronous_ready" in flags or "asynchronous_unready" in flags:
        said = legacy_asynchronous(type(component))
        if said is not None:
            parts["supports"]["asynchronous"] = said
    return replace(declared, **{part: replace(getattr(declared, part), **values) for part, values in parts.items()})
