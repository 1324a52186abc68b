"""Ditto (Li, Hu, Beirami, Smith 2021) is built in now: :class:`lfed.personal.Ditto` (``algorithm: ditto``).

This file was its first spelling as a user's own component (docs/extending.md); it stays as the name
``ditto.Ditto`` for configs that use it, and is the built-in class itself:

    model:
      objective: {class_path: ditto.Ditto, init_args: {lam: 0.1}}      # same as lfed.personal.Ditto
"""

from lfed.personal import Ditto

__all__ = ["Ditto"]
