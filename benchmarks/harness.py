"""The benchmarks' one harness: time a callable or a command, wait for a quiet machine, interleave variants, report
medians (min, max) with the load beside them, write markdown table rows, parse the flags every benchmark shares.

    import harness                                  # benchmarks/ is on sys.path when a script there runs

    p = harness.parser(__doc__, repeats=3)          # --repeats, --quick (and --out) besides the script's own flags
    a = p.parse_args()
    runs = harness.interleave({"native": call_a, "matmul": call_b}, repeats=a.repeats, warmup=1)
    print(harness.table(["form", "s (median)", "min", "max", "load"],
                        [[name, t.median, t.min, t.max, t.load_range()] for name, t in runs.items()]))

**The quiet rule** (BENCHMARKS.md): every timed run starts once the 1-minute load average is below ``$QUIET_LOAD``
(default 1.0), waiting at most ``$QUIET_WAIT`` seconds (default 600; ``QUIET_WAIT=0``: never wait, for a smoke test
or a test). :func:`wait_quiet` never fails: a machine that does not get quiet in time gives its (high) load, which
the figures then show. ``../shared/tools/quiet-run`` waits once before a whole benchmark; a benchmark of many runs
heats the load itself, so the harness waits again before every timed run.

**A run's figure** is the seconds the harness's clock measures around the call (synchronized by ``sync`` before and
after, for CUDA), unless ``figure`` is given: then ``figure(result)`` of what the call returned (the variant timed
itself: a steady round measured inside a Lightning run by :func:`step_clock`, a child process's ``RESULT`` line).

**Interleaving**: every repeat runs every variant once (``order``: ``"same"`` A B A B, ``"flip"`` A B B A,
``"rotate"`` A B C, B C A, ...), after ``warmup`` untimed calls of each, so a drift of the machine falls on all of
them alike.

The clock, the load and the sleep are this module's :data:`clock`, :func:`loadavg` and :data:`sleep`, looked up at
each call (the tests replace them with a fake machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

clock: Callable[[], float] = time.perf_counter
sleep: Callable[[float], None] = time.sleep


def loadavg() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


# ----------------------------------------------------------------------------- the quiet machine


def wait_quiet(limit: float | None = None, max_wait: float | None = None, poll: float = 5.0) -> tuple[float, float]:
    """Sleep until the 1-minute load is below ``limit`` (``$QUIET_LOAD``, 1.0), at most ``max_wait`` seconds
    (``$QUIET_WAIT``, 600); return the load seen last and the seconds waited."""
    limit = float(os.environ.get("QUIET_LOAD", 1.0)) if limit is None else limit
    max_wait = float(os.environ.get("QUIET_WAIT", 600)) if max_wait is None else max_wait
    start = clock()
    load = loadavg()
    while load >= limit and clock() - start < max_wait:
        sleep(poll)
        load = loadavg()
    return load, clock() - start


# ----------------------------------------------------------------------------- timings


@dataclass
class Timing:
    """The figures of one variant: one sample per timed run, the load before it, what the call returned, and the
    seconds waited for a quiet machine before it."""

    samples: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)

    def add(self, sample: float, load: float, result: Any = None, waited: float = 0.0) -> None:
        self.samples.append(sample)
        self.loads.append(load)
        self.results.append(result)
        self.waits.append(waited)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def runs(self, digits: int = 3) -> str:
        """Each run as ``seconds @ load``: ``0.412 @ 0.85, 0.405 @ 0.91``."""
        return ", ".join(f"{s:.{digits}f} @ {load:.2f}" for s, load in zip(self.samples, self.loads))

    def load_range(self) -> str:
        return load_range(self.loads)


def load_range(loads: Iterable[float]) -> str:
    """``0.52-0.97`` (one value alone: ``0.52``; none: ``-``)."""
    loads = list(loads)
    if not loads:
        return "-"
    lo, hi = min(loads), max(loads)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


def all_loads(timings: Iterable[Timing]) -> list[float]:
    return [x for t in timings for x in t.loads]


class Stopwatch:
    """``with stopwatch() as sw: ...`` then ``sw.seconds`` (``sync`` called before starting and before stopping)."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.start = self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        if self.sync is not None:
            self.sync()
        self.start = clock()
        return self

    def __exit__(self, *exc) -> None:
        if self.sync is not None:
            self.sync()
        self.seconds = clock() - self.start

    def elapsed(self) -> float:
        """Seconds since the start (while running)."""
        return clock() - self.start


def stopwatch(sync: Callable[[], None] | None = None) -> Stopwatch:
    return Stopwatch(sync)


ORDERS = ("same", "flip", "rotate")


def order_of(names: Sequence[str], repeat: int, order: str = "same") -> list[str]:
    """The variants' order in repeat ``repeat`` (0-based)."""
    names = list(names)
    if order == "same":
        return names
    if order == "flip":
        return names if repeat % 2 == 0 else names[::-1]
    if order == "rotate":
        r = repeat % len(names) if names else 0
        return names[r:] + names[:r]
    raise ValueError(f"order: {order!r} is not one of {ORDERS}")


def interleave(variants: Mapping[str, Callable[[], Any]], *, repeats: int, warmup: int = 0,
               figure: Callable[[Any], float] | None = None, order: str = "same", quiet: bool = True,
               max_wait: float | None = None, sync: Callable[[], None] | None = None,
               log: Callable[[str, int, float, float, Any], None] | None = None) -> dict[str, Timing]:
    """Time every variant ``repeats`` times, interleaved (``order``), each after ``warmup`` untimed calls; before every
    timed run wait for a quiet machine (``quiet``, at most ``max_wait`` s, default ``$QUIET_WAIT``; else only read
    the load). ``figure``: the sample is
    ``figure(result)`` of the call's return (it timed itself), not the harness's seconds. ``log(name, repeat,
    sample, load, result)`` after every timed run (e.g. :func:`print_run`)."""
    order_of((), 0, order)  # refuses an unknown order before any work
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    timings = {name: Timing() for name in variants}
    for rep in range(repeats):
        for name in order_of(list(variants), rep, order):
            load, waited = wait_quiet(max_wait=max_wait) if quiet else (loadavg(), 0.0)
            with stopwatch(sync) as sw:
                result = variants[name]()
            sample = sw.seconds if figure is None else float(figure(result))
            timings[name].add(sample, load, result, waited)
            if log is not None:
                log(name, rep, sample, load, result)
    return timings


def measure(fn: Callable[[], Any], *, repeats: int = 1, warmup: int = 0, figure: Callable[[Any], float] | None = None,
            quiet: bool = True, max_wait: float | None = None, sync: Callable[[], None] | None = None) -> Timing:
    """One variant's :func:`interleave`."""
    return interleave({"": fn}, repeats=repeats, warmup=warmup, figure=figure, quiet=quiet, max_wait=max_wait, sync=sync)[""]


def print_run(name: str, repeat: int, sample: float, load: float, result: Any = None) -> None:
    """A :func:`interleave` ``log``: ``repeat 1 native: 0.4123 s (load 0.85)``."""
    print(f"repeat {repeat + 1} {name}: {sample:.4f} s (load {load:.2f})", flush=True)


# ----------------------------------------------------------------------------- commands and child processes


def command(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
            timeout: float | None = None, check: bool = True) -> Callable[[], str]:
    """A variant that runs ``argv`` and returns its stdout (``check``: a failure raises with the end of stderr)."""

    def run() -> str:
        done = subprocess.run(list(argv), env=None if env is None else dict(env), cwd=cwd, capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(map(str, argv))}: exit {done.returncode}\n{done.stderr[-3000:]}")
        return done.stdout

    return run


def python(args: Sequence[str], **kwargs) -> Callable[[], str]:
    """:func:`command` of this interpreter."""
    return command([sys.executable, *args], **kwargs)


RESULT = "RESULT "


def result_line(stdout: str, prefix: str = RESULT) -> Any:
    """The JSON of a child's last ``RESULT {...}`` line (see :func:`print_result`)."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(prefix)]
    if not lines:
        raise RuntimeError(f"no {prefix.strip()} line in the output:\n{stdout[-2000:]}")
    return json.loads(lines[-1][len(prefix):])


def print_result(value: Any) -> None:
    """What a child prints for its parent's :func:`result_line`."""
    print(RESULT + json.dumps(value), flush=True)


# ----------------------------------------------------------------------------- inside a Lightning run


def step_clock(sync: Callable[[], None] | None = None, *, cap_s: float | None = None, skip: int = 0):
    """A Lightning callback timing every training step (a round, a server step) from ``on_train_batch_start`` to
    ``on_train_batch_end``: ``.seconds``; ``.steady()`` = the median after the first ``skip``; and every evaluation
    (``on_validation_start`` to ``on_validation_end``): ``.evals``. ``cap_s``: stop the run once at least 3 steps
    after ``skip`` have spent that many seconds."""
    from lightning.pytorch import Callback

    class StepClock(Callback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.evals: list[float] = []
            self._step, self._eval = Stopwatch(sync), Stopwatch(sync)

        def on_train_batch_start(self, *args, **kwargs) -> None:
            self._step.__enter__()

        def on_train_batch_end(self, trainer, *args, **kwargs) -> None:
            self._step.__exit__()
            self.seconds.append(self._step.seconds)
            timed = self.seconds[skip:]
            if cap_s is not None and len(timed) >= 3 and sum(timed) > cap_s:
                trainer.should_stop = True

        def on_validation_start(self, *args, **kwargs) -> None:
            self._eval.__enter__()

        def on_validation_end(self, *args, **kwargs) -> None:
            self._eval.__exit__()
            self.evals.append(self._eval.seconds)

        def steady(self, skip_: int | None = None) -> float:
            return statistics.median(self.seconds[skip if skip_ is None else skip_:])

    return StepClock()


# ----------------------------------------------------------------------------- tables and flags


def cell(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def row(cells: Iterable[Any], digits: int = 3) -> str:
    """``| a | 0.123 | 1,000 |`` (floats to ``digits`` places, ints with thousands separators, strings as they are)."""
    return "| " + " | ".join(cell(c, digits) for c in cells) + " |"


def table(header: Sequence[str], rows: Iterable[Iterable[Any]], digits: int = 3) -> str:
    """A markdown table: the header, its rule and one :func:`row` per row."""
    lines = [row(header), "|" + "---|" * len(header)]
    return "\n".join(lines + [row(r, digits) for r in rows])


def machine_line() -> str:
    """``# 2026-11-28 03:15 UTC, x86_64, 2 cores, torch 2.14.1, 2 threads, load 0.85`` (torch only if imported)."""
    parts = [f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", platform.processor() or platform.machine(),
             f"{os.cpu_count()} cores"]
    torch = sys.modules.get("torch")
    if torch is not None:
        parts += [f"torch {torch.__version__}", f"{torch.get_num_threads()} threads"]
    return ", ".join(parts + [f"load {loadavg():.2f}"])


def parser(doc: str | None = None, *, repeats: int | None = None, quick: bool = True, out: str | None | bool = False,
           out_flags: Sequence[str] = ("--out",), out_help: str = "also write the results to this file",
           quick_help: str = "the smallest sizes: a smoke test, not a figure",
           description: str | None = None) -> argparse.ArgumentParser:
    """An argument parser with the flags every benchmark shares: ``--repeats`` (when ``repeats`` is given: its
    default), ``--quick`` (the smallest sizes: a smoke test of a few seconds) and ``--out`` (when ``out`` is not
    False: its default; ``out_flags`` are its spellings, e.g. ``("--out", "--json")``, stored as ``out``). ``doc``,
    the script's docstring, is its help (its first line the description)."""
    p = argparse.ArgumentParser(description=description if description is not None else doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats, help=f"timed runs of each variant (default {repeats})")
    if quick:
        p.add_argument("--quick", action="store_true", help=quick_help)
    if out is not False:
        p.add_argument(*out_flags, dest="out", default=out, help=out_help)
    return p
