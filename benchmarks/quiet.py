"""Wait for a quiet machine before each timed run (the load rule of BENCHMARKS.md).

``../shared/tools/quiet-run`` waits once, before a whole benchmark; a benchmark of many runs heats
the 1-minute load average itself, so every timed run should wait again. ``wait_quiet()`` sleeps
until ``os.getloadavg()[0]`` is below ``limit`` (``$QUIET_LOAD``, default 1.0), at most ``max_wait``
seconds (``$QUIET_WAIT``, default 600), and returns the load it saw last and the seconds it waited,
so the caller can print the load beside the figure. It never fails: if the machine does not get
quiet in time it returns the (high) load, which the table then shows.
"""

from __future__ import annotations

import os
import time


def wait_quiet(limit: float | None = None, max_wait: float | None = None, poll: float = 5.0) -> tuple[float, float]:
    limit = float(os.environ.get("QUIET_LOAD", 1.0)) if limit is None else limit
    max_wait = float(os.environ.get("QUIET_WAIT", 600)) if max_wait is None else max_wait
    start = time.monotonic()
    load = os.getloadavg()[0]
    while load >= limit and time.monotonic() - start < max_wait:
        time.sleep(poll)
        load = os.getloadavg()[0]
    return load, time.monotonic() - start
