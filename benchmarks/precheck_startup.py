"""CPU seconds of a settings mistake and of ``lfed fit --help``, before and after the pre-check (issue 66, lfed/precheck.py).

    python benchmarks/precheck_startup.py --before 2c03bce --repeats 5

Each command runs in a fresh interpreter through an ``lfed/entry.py``: the one of ``--before`` (a git ref, read with
``git show``) or this checkout's, loaded from its file by the same few lines (so both pay the same), ``main`` called as
the ``lfed`` console script calls it (the program's ``main``: ``gc.freeze`` at exit applies to both). The two take turns
and the order flips every repeat; before each run the script waits up to ``--quiet-wait`` seconds for a 1-minute load
below 1.0 and prints the load it started at beside the run's CPU seconds (user + system, ``os.wait4``). Medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "lfed fit --config configs/quickstart.yaml --model.algorithm fedprx": (
        ["fit", "--config", "configs/quickstart.yaml", "--model.algorithm", "fedprx"], 2),
    "lfed fit --help": (["fit", "--help"], 0),
}
RUNNER = """import importlib.util, sys
spec = importlib.util.spec_from_file_location("lfed_entry_measured", sys.argv[1])
entry = importlib.util.module_from_spec(spec)
spec.loader.exec_module(entry)
main = entry.main  # the program's main, as the console script's
sys.argv = ["lfed", *sys.argv[2:]]
main()
"""


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def quiet(wait: float) -> float:
    end = time.monotonic() + wait
    while load() >= 1.0 and time.monotonic() < end:
        time.sleep(2)
    return load()


def cpu_seconds(entry: Path, args: list[str], expect: int) -> float:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("LFED_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(entry), *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != expect:
        raise SystemExit(f"{args}: exit {proc.returncode}, expected {expect}: {stderr.decode()[-500:]}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git ref whose lfed/entry.py is 'before' (the commit before the pre-check)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quiet-wait", type=float, default=15.0, help="seconds to wait for a load below 1.0 before each run")
    a = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="precheck_before_"))
    before = folder / "entry.py"
    before.write_text(subprocess.run(["git", "show", f"{a.before}:lfed/entry.py"], cwd=REPO, check=True,
                                     capture_output=True, text=True).stdout)
    variants = {"before": before, "after": REPO / "lfed" / "entry.py"}
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {(v, c): [] for v in variants for c in COMMANDS}
    for r in range(a.repeats):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for command, (args, expect) in COMMANDS.items():
            for variant in order:
                at = quiet(a.quiet_wait)
                seconds = cpu_seconds(variants[variant], args, expect)
                runs[(variant, command)].append((seconds, at))
                print(f"repeat {r} {variant:6} {command}: {seconds:.2f} CPU s, load {at:.2f}", flush=True)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, before = {a.before}, medians of {a.repeats}\n")
    print("| command | before: CPU s (loads) | after: CPU s (loads) | after / before |")
    print("|---|---|---|---|")
    for command in COMMANDS:
        cells = []
        for variant in variants:
            xs = runs[(variant, command)]
            loads = [at for _, at in xs]
            cells.append((statistics.median(s for s, _ in xs), f"{min(loads):.2f}-{max(loads):.2f}"))
        (b, bl), (f, fl) = cells
        print(f"| `{command}` | {b:.2f} ({bl}) | {f:.2f} ({fl}) | {f / b:.2f} |")


if __name__ == "__main__":
    main()
