"""The ``lfed`` command: ``lfed fit|validate|test`` (:mod:`lfed.lightning.cli`) and ``lfed grid`` (:mod:`lfed.lightning.grid`).

The dispatch lives here, above both, so neither imports the other's caller.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Entry point of the ``lfed`` console script (and ``python -m lfed``)."""
    if sys.argv[1:2] == ["grid"]:
        from lfed.lightning.grid import main as grid_main

        grid_main(sys.argv[2:])
        return
    from lfed.lightning.cli import main as cli_main

    cli_main()
