"""The ``lfed`` command: ``lfed fit|validate|test`` (:mod:`lfed.lightning.cli`), ``lfed grid`` (:mod:`lfed.lightning.grid`),
``lfed audit`` (:mod:`lfed.lightning.audit`) and ``lfed plot`` (:mod:`lfed.evaluation.curves`: no Lightning, no torch).

The dispatch lives here, above them all, so none imports another's caller. ``lfed``, ``lfed --help`` and ``lfed
--version`` import none of them (nor torch): they answer at once. A settings mistake of ``lfed fit|validate|test``
that can be seen without torch (a missing config file, a key that is not a setting, ``--model.algorithm fedprx``,
``--model.fraction 1.5``) is said by :func:`lfed.precheck.precheck` before the command imports torch and Lightning, in
the full command's words (issue 66: a mistake costs a tenth of a CPU second, not five and a half).
"""

from __future__ import annotations

import os
import sys

__all__ = ["main"]


#: ``lfed``, ``lfed -h``: the commands, printed without importing Lightning (``lfed <command> --help`` lists settings).
USAGE = """usage: lfed {fit,validate,test,grid,audit,plot} [--help] [--version] ...

lfed: federated learning on PyTorch Lightning. One training step is one federated round.

commands:
  fit       train a run:                  lfed fit --config configs/quickstart.yaml
  validate  score a checkpoint (val):     lfed validate --ckpt_path runs/.../checkpoints/last.ckpt
  test      score a checkpoint (test):    lfed test --ckpt_path runs/.../checkpoints/last.ckpt
  grid      many runs of one config in one process and one Trainer:
                                          lfed grid --config configs/quickstart.yaml --sweep sweeps/quickstart_client_lr.yaml
  audit     a DP-FedAvg run with canaries, then its one-run privacy audit (claimed ε against the audit's bound):
                                          lfed audit --config configs/dp_digits.yaml
  plot      several runs' curves from their metrics.csv in one PNG (no account needed):
                                          lfed plot runs/ --metric test/acc --metric test/loss -o compare.png

'lfed <command> --help' lists the command's settings; docs/ (algorithms.md, extending.md, grids.md) explains them.
'lfed --version' prints the versions of lfed, torch and Lightning."""

#: The commands, in the order of :data:`USAGE`.
COMMANDS = ("fit", "validate", "test", "grid", "audit", "plot")


def version_line() -> str:
    """``lfed 0.5.0, torch 2.14.1, lightning 2.6.6``: the installed versions, read from the packages' metadata (torch and
    Lightning are not imported); a package that is not installed is ``not installed``."""
    from importlib.metadata import PackageNotFoundError, version

    from lfed import __version__

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"lfed {__version__}, torch {installed('torch')}, lightning {installed('lightning')}"


def main() -> None:
    """Entry point of the ``lfed`` console script (and ``python -m lfed``).

    When it is the program (the ``lfed`` script's or ``python -m lfed``'s ``main``, not a call from a test or a
    notebook), the objects alive at its end are frozen out of the garbage collector (``gc.freeze``) as it returns or
    exits: the process ends next, and the collections of the interpreter's shutdown over the millions of objects the
    imports made (torch, Lightning, torchmetrics, transformers) took 1.5 to 2 CPU s of every command, ``lfed fit
    --help`` or a mistake included (issue 66). Files, checkpoints and loggers are closed before, by the command itself
    and ``atexit``; Python never promised finalizers at exit.
    """
    try:
        _dispatch()
    finally:
        if getattr(sys.modules.get("__main__"), "main", None) is main:
            import gc

            gc.freeze()


def _dispatch() -> None:
    """Send the command line to its command."""
    if sys.argv[1:] in ([], ["-h"], ["--help"]):
        print(USAGE)
        sys.exit(0 if sys.argv[1:] else 2)
    if sys.argv[1:] in (["--version"], ["-V"]):
        print(version_line())
        sys.exit(0)
    if sys.argv[1] not in COMMANDS and not sys.argv[1].startswith("-"):
        print(f"lfed: error: {sys.argv[1]!r} is not a command; the commands are {', '.join(COMMANDS[:-1])} and {COMMANDS[-1]} "
              "(lfed --help)", file=sys.stderr)
        sys.exit(2)
    if sys.argv[1:2] == ["plot"]:
        from lfed.evaluation.curves import main as plot_main

        plot_main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["audit"]:
        from lfed.lightning.audit import main as audit_main

        audit_main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["grid"]:
        from lfed.lightning.grid import main as grid_main

        grid_main(sys.argv[2:])
        return
    if sys.argv[1] in ("fit", "validate", "test") and os.environ.get("LFED_DEBUG", "").strip() in ("", "0"):
        from lfed.precheck import precheck

        mistake = precheck(sys.argv[1:])  # before torch and Lightning: None when it sees none
        if mistake is not None:
            print(f"lfed {sys.argv[1]}: error: {mistake}", file=sys.stderr, flush=True)
            sys.exit(2)
    from lfed.lightning.cli import main as cli_main

    cli_main()
