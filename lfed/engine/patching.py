"""A method of some module instances replaced for the length of a ``with`` block (the engine's step-time forms).

:func:`lfed.engine.conv.conv_forms` (a convolution's form) and :func:`lfed.engine.norm.batch_norms` (BatchNorm with
each client's own statistics) both replace a method on module *instances*, never on their class, and put back
exactly what was there, so the net is unchanged outside and nested uses compose.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

from torch import nn

__all__ = ["instance_methods"]


@contextlib.contextmanager
def instance_methods(name: str, replacements: Iterable[tuple[nn.Module, Callable]]) -> Iterator[None]:
    """Inside, each ``module.<name>`` of ``replacements`` is its given callable; after (also after an error), each
    instance has back what it had (its own attribute, or none: the class's method)."""
    patched: list[tuple[nn.Module, object]] = []
    try:
        for module, fn in replacements:
            patched.append((module, module.__dict__.get(name)))
            module.__dict__[name] = fn
        yield
    finally:
        for module, before in reversed(patched):
            if before is None:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = before
