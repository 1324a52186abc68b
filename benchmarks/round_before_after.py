"""lfed's steady round, two checkouts interleaved: is a change no slower? (issue 50's "the round is no slower").

    python benchmarks/round_before_after.py --before /tmp/v04 --after . --repeats 5

Each checkout runs its own benchmark scripts in a fresh process with its own ``lfed`` first on ``PYTHONPATH``:
the quickstart (``benchmarks/round_seconds.py configs/quickstart.yaml``, vmap backend: median seconds of the rounds
after the first) and BENCHMARKS.md's MNIST peer job (``benchmarks/peers/lfed_job.py``: 100 shard clients, 10 a
round, MLP 2NN; median of the intervals between rounds after the first). Runs alternate between the checkouts (the
order flips every repeat), each waits for the 1-minute load to fall below 1.0 (``benchmarks/quiet.py``) and prints
it beside the figure; the table gives medians over the repeats and the after/before ratio. Also times the imports
of a run without Lightning (``build_run`` + ``fit_run``) against ``lfed fit``'s (``lfed.lightning.cli``), medians
of ``--repeats`` fresh interpreters.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quiet import wait_quiet  # noqa: E402

IMPORTS = {
    "build_run + fit_run": {"0.4": "import lfed.settings, lfed.rounds", "0.5": "import lfed.core.settings, lfed.core.fit"},
    "lfed fit (the CLI)": {"0.4": "import lfed.cli", "0.5": "import lfed.lightning.cli"},
}


def run(checkout: Path, args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(checkout), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"{checkout}: {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout


def quickstart(checkout: Path, rounds: int) -> float:
    out = run(checkout, ["benchmarks/round_seconds.py", "configs/quickstart.yaml", "--rounds", str(rounds), "--backends", "vmap"])
    row = next(line for line in out.splitlines() if line.startswith("| configs/quickstart.yaml"))
    return float(row.split("|")[3])


def mnist(checkout: Path, rounds: int) -> float:
    out = run(checkout, ["benchmarks/peers/lfed_job.py", "--rounds", str(rounds)])
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    return statistics.median(result["round_s"][1:])


def version(checkout: Path) -> str:
    init = (checkout / "lfed" / "__init__.py").read_text()
    return "0.5" if (checkout / "lfed" / "core").is_dir() else re.search(r'__version__ = "(\d+\.\d+)', init).group(1)


def import_seconds(checkout: Path, statement: str) -> float:
    t = time.perf_counter()
    run(checkout, ["-c", statement])
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, default=Path("."))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--skip-imports", action="store_true", help="only the rounds (the import statements are 0.4's and 0.5's)")
    a = p.parse_args()
    sides = {"before": a.before.resolve(), "after": a.after.resolve()}
    jobs = {"quickstart": quickstart, "MNIST peer job": mnist}
    seen: dict[tuple[str, str], list[float]] = {}
    loads: dict[tuple[str, str], list[float]] = {}
    for i in range(a.repeats):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for job, fn in jobs.items():
            for side in order:
                load, _ = wait_quiet(1.0, 60)
                s = fn(sides[side], a.rounds)
                seen.setdefault((job, side), []).append(s)
                loads.setdefault((job, side), []).append(load)
                print(f"repeat {i} {job} {side}: {s:.4f} s/round (load {load:.2f})", flush=True)
    print(f"\nbefore = {sides['before']} (lfed {version(sides['before'])}), after = {sides['after']} "
          f"(lfed {version(sides['after'])}); {a.repeats} runs each, interleaved, {a.rounds} rounds a run\n")
    print("| job | before s/round (median) | after s/round (median) | after / before | runs | loads at start |")
    print("|---|---|---|---|---|---|")
    for job in jobs:
        b, f = statistics.median(seen[(job, "before")]), statistics.median(seen[(job, "after")])
        shown = ", ".join(f"{x:.2f}" for x in loads[(job, "before")] + loads[(job, "after")])
        print(f"| {job} | {b:.4f} | {f:.4f} | {f / b:.3f} | {a.repeats} + {a.repeats} | {shown} |")
    if a.skip_imports:
        return
    print("\n| imports | before s (median) | after s (median) | runs | loads at start |")
    print("|---|---|---|---|---|")
    for what, statements in IMPORTS.items():
        times: dict[str, list[float]] = {side: [] for side in sides}
        import_loads: list[float] = []
        for i in range(a.repeats):  # interleaved, the order flipping every repeat, as the rounds above
            for side in (list(sides) if i % 2 == 0 else list(reversed(sides))):
                checkout = sides[side]
                load, _ = wait_quiet(1.0, 60)
                import_loads.append(load)
                times[side].append(import_seconds(checkout, statements["0.5" if version(checkout) == "0.5" else "0.4"]))
        print(f"| {what} | {statistics.median(times['before']):.2f} | {statistics.median(times['after']):.2f} | "
              f"{a.repeats} + {a.repeats} | {', '.join(f'{x:.2f}' for x in import_loads)} |")


if __name__ == "__main__":
    main()
