"""The ``lfed`` command: ``lfed fit|validate|test`` (:mod:`lfed.lightning.cli`), ``lfed grid`` (:mod:`lfed.lightning.grid`)
and ``lfed audit`` (:mod:`lfed.lightning.audit`).

The dispatch lives here, above both, so neither imports the other's caller.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


#: ``lfed``, ``lfed -h``: the commands, printed without importing Lightning (``lfed <command> --help`` lists settings).
USAGE = """usage: lfed {fit,validate,test,grid,audit} [--help] ...

lfed: federated learning on PyTorch Lightning. One training step is one federated round.

commands:
  fit       train a run:                  lfed fit --config configs/quickstart.yaml
  validate  score a checkpoint (val):     lfed validate --ckpt_path runs/.../checkpoints/last.ckpt
  test      score a checkpoint (test):    lfed test --ckpt_path runs/.../checkpoints/last.ckpt
  grid      many runs of one config in one process and one Trainer:
                                          lfed grid --config configs/quickstart.yaml --sweep sweeps/quickstart_client_lr.yaml
  audit     a DP-FedAvg run with canaries, then its one-run privacy audit (claimed ε against the audit's bound):
                                          lfed audit --config configs/dp_digits.yaml

'lfed <command> --help' lists the command's settings; docs/ (algorithms.md, extending.md, grids.md) explains them."""


def main() -> None:
    """Entry point of the ``lfed`` console script (and ``python -m lfed``)."""
    if sys.argv[1:] in ([], ["-h"], ["--help"]):
        print(USAGE)
        sys.exit(0 if sys.argv[1:] else 2)
    if sys.argv[1] not in ("fit", "validate", "test", "grid", "audit") and not sys.argv[1].startswith("-"):
        print(f"lfed: error: {sys.argv[1]!r} is not a command; the commands are fit, validate, test, grid and audit "
              "(lfed --help)", file=sys.stderr)
        sys.exit(2)
    if sys.argv[1:2] == ["audit"]:
        from lfed.lightning.audit import main as audit_main

        audit_main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["grid"]:
        from lfed.lightning.grid import main as grid_main

        grid_main(sys.argv[2:])
        return
    from lfed.lightning.cli import main as cli_main

    cli_main()
