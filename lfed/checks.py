"""Checks of configuration values, one message style for all of lfed.

Each argument is checked once, in the component (or function) that owns it, with these helpers:
a bad value fails early with a :class:`ValueError` that names the argument, says what is
allowed and shows what was given (``"mu: must be a finite number >= 0, got -0.1"``).

Example:
    >>> number("client_lr", 0.05, above=0)
    0.05
    >>> number("p_inactive", 1.5, at_least=0, at_most=1)
    Traceback (most recent call last):
    ...
    ValueError: p_inactive: must be a finite number in [0, 1], got 1.5
    >>> integer("fisher_samples", 0, at_least=1)
    Traceback (most recent call last):
    ...
    ValueError: fisher_samples: need an integer >= 1, got 0
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["HookError", "integer", "number", "one_of"]


class HookError(ValueError):
    """A component broke the contract of one of its hooks (a user's own component, docs/extending.md).

    Its message is one line that names the hook and the fix (``"loss_term: ... return [B] ..."``). It may
    be raised in round 0, where the hook first runs: the ``lfed`` command shows it as one line and exit
    status 2 all the same (:mod:`lfed.lightning.cli`), as a mistake in the configuration.
    """


def number(
    name: str,
    value: Any,
    *,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    at_most: float | None = None,
    detail: str = "",
) -> float:
    """``float(value)`` if it is a finite real number within the given bounds (bools are refused).

    Args:
        name: The argument's name, for the message.
        value: The value given.
        above, at_least, below, at_most: Exclusive / inclusive lower and upper bounds.
        detail: Appended to the rule in the message (``" (AdaFL's score decay α)"``).

    Raises:
        ValueError: ``"<name>: must be a finite number <bounds><detail>, got <value>"``.
    """
    low, high = (above, "(") if above is not None else (at_least, "["), (below, ")") if below is not None else (at_most, "]")
    if low[0] is not None and high[0] is not None:  # an interval: "in [0, 1)"
        rule = f"in {low[1]}{low[0]:g}, {high[0]:g}{high[1]}"
    else:
        bounds = [f"> {above:g}" if above is not None else "", f">= {at_least:g}" if at_least is not None else "",
                  f"< {below:g}" if below is not None else "", f"<= {at_most:g}" if at_most is not None else ""]
        rule = "".join(bounds)
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        v = float(value)
        ok = ((above is None or v > above) and (at_least is None or v >= at_least)
              and (below is None or v < below) and (at_most is None or v <= at_most))
    if not ok:
        raise ValueError(f"{name}: must be a finite number{' ' + rule if rule else ''}{detail}, got {value!r}")
    return float(value)


def integer(name: str, value: Any, *, at_least: int | None = None, detail: str = "") -> int:
    """``int(value)`` if it is an integer (not a bool) ``>= at_least``.

    Raises:
        ValueError: ``"<name>: need an integer >= <at_least><detail>, got <value>"``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (at_least is not None and value < at_least):
        rule = f" >= {at_least}" if at_least is not None else ""
        raise ValueError(f"{name}: need an integer{rule}{detail}, got {value!r}")
    return int(value)


def one_of(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices``.

    Raises:
        ValueError: ``"<name>: <value> is not one of <choices>"``.
    """
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}: {value!r} is not one of {choices}")
    return value


def name_matches(argument: str, names: Sequence[str], pattern: str, what: str) -> list[str]:
    """The ``names`` that the ``fnmatch`` glob ``pattern`` matches; an error naming ``argument`` when none does.

    ``what`` says what the names are (``"parameter of Sequential"``), for the message, which lists them.
    """
    import fnmatch

    hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    if not hits:
        shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
        raise ValueError(f"{argument}: pattern {pattern!r} matches no {what}; its parameters are: {shown}")
    return hits
