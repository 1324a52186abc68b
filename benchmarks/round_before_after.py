"""lfed's steady round, two checkouts interleaved: is a change no slower? (issue 50's "the round is no slower").

    python benchmarks/round_before_after.py --before /tmp/v04 --after . --repeats 5

Each checkout runs its own benchmark scripts in a fresh process with its own ``lfed`` first on ``PYTHONPATH``:
the quickstart (``benchmarks/round_seconds.py configs/quickstart.yaml``, vmap backend: median seconds of the rounds
after the first) and BENCHMARKS.md's MNIST peer job (``benchmarks/peers/lfed_job.py``: 100 shard clients, 10 a
round, MLP 2NN; median of the intervals between rounds after the first). Runs alternate between the checkouts (the
order flips every repeat), each waits for the 1-minute load to fall below 1.0 (:mod:`harness`, at most 60 s) and prints
it beside the figure; the table gives medians over the repeats and the after/before ratio. Also times the imports
of a run without Lightning (``build_run`` + ``fit_run``) against ``lfed fit``'s (``lfed.lightning.cli``), medians
of ``--repeats`` fresh interpreters.
"""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path

import harness

IMPORTS = {
    "build_run + fit_run": {"0.4": "import lfed.settings, lfed.rounds", "0.5": "import lfed.core.settings, lfed.core.fit"},
    "lfed fit (the CLI)": {"0.4": "import lfed.cli", "0.5": "import lfed.lightning.cli"},
}


def run(checkout: Path, args: list[str]) -> str:
    return in_checkout(checkout, args)()


def in_checkout(checkout: Path, args: list[str]):
    """A :func:`harness.python` variant of ``args`` in ``checkout``, its lfed first on the path."""
    return harness.python(args, cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout), "WANDB_MODE": "disabled"},
                          timeout=900)


def quickstart(checkout: Path, rounds: int) -> float:
    out = run(checkout, ["benchmarks/round_seconds.py", "configs/quickstart.yaml", "--rounds", str(rounds), "--backends", "vmap"])
    row = next(line for line in out.splitlines() if line.startswith("| configs/quickstart.yaml"))
    return float(row.split("|")[3])


def mnist(checkout: Path, rounds: int) -> float:
    result = harness.result_line(run(checkout, ["benchmarks/peers/lfed_job.py", "--rounds", str(rounds)]))
    return statistics.median(result["round_s"][1:])


def version(checkout: Path) -> str:
    init = (checkout / "lfed" / "__init__.py").read_text()
    return "0.5" if (checkout / "lfed" / "core").is_dir() else re.search(r'__version__ = "(\d+\.\d+)', init).group(1)


def main() -> None:
    p = harness.parser(__doc__, repeats=5)
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, default=Path("."))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--skip-imports", action="store_true", help="only the rounds (the import statements are 0.4's and 0.5's)")
    a = p.parse_args()
    repeats, rounds = (1, 3) if a.quick else (a.repeats, a.rounds)
    sides = {"before": a.before.resolve(), "after": a.after.resolve()}
    jobs = {"quickstart": quickstart, "MNIST peer job": mnist}

    def log(name, repeat, s, load, _):
        print(f"repeat {repeat} {name[0]} {name[1]}: {s:.4f} s/round (load {load:.2f})", flush=True)

    # every repeat runs every (job, checkout) once; the order flips every repeat (at most a minute's wait for quiet)
    seen = harness.interleave({(job, side): (lambda fn=fn, side=side: fn(sides[side], rounds)) for job, fn in jobs.items()
                               for side in sides}, repeats=repeats, order="flip", figure=float, max_wait=60, log=log)
    print(f"\nbefore = {sides['before']} (lfed {version(sides['before'])}), after = {sides['after']} "
          f"(lfed {version(sides['after'])}); {repeats} runs each, interleaved, {rounds} rounds a run\n")
    print("| job | before s/round (median) | after s/round (median) | after / before | runs | loads at start |")
    print("|---|---|---|---|---|---|")
    for job in jobs:
        b, f = seen[(job, "before")].median, seen[(job, "after")].median
        shown = ", ".join(f"{x:.2f}" for x in seen[(job, "before")].loads + seen[(job, "after")].loads)
        print(f"| {job} | {b:.4f} | {f:.4f} | {f / b:.3f} | {repeats} + {repeats} | {shown} |")
    if a.skip_imports:
        return
    print("\n| imports | before s (median) | after s (median) | runs | loads at start |")
    print("|---|---|---|---|---|")
    for what, statements in IMPORTS.items():
        # each a fresh interpreter's wall time, interleaved, the order flipping every repeat as the rounds above
        times = harness.interleave(
            {side: in_checkout(sides[side], ["-c", statements["0.5" if version(sides[side]) == "0.5" else "0.4"]])
             for side in sides}, repeats=repeats, order="flip", max_wait=60)
        print(f"| {what} | {times['before'].median:.2f} | {times['after'].median:.2f} | "
              f"{repeats} + {repeats} | {', '.join(f'{x:.2f}' for x in harness.all_loads(times.values()))} |")


if __name__ == "__main__":
    main()
