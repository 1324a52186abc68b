"""Write the small synthetic traces shipped in configs/traces/ (docs/traces.md), in FedScale's formats as JSON.

    python scripts/make_synthetic_trace.py [--clients 32] [--period 3600] [--seed 0] [--out configs/traces]

* ``synthetic_behave.json`` (FedScale's ``client_behave_trace``): each client online in 1 to 3 intervals of a period of
  ``--period`` seconds (an hour by default: a day's cycle compressed so that a short run sees it turn), covering 25%
  to 65% of it, its first interval starting at a uniform phase (clients "in every time zone");
* ``synthetic_device.json`` (FedScale's ``client_device_capacity``): milliseconds per example log-normal around 40
  (a heavy tail of slow devices), kilobits per second log-uniform in [500, 20000].

Pure Python (``random.Random(seed)``), times rounded to 0.1 s and speeds to 0.01: the same files on every machine.
``tests/participation/test_traces.py`` checks that the shipped files are this script's output.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path


def make(clients: int = 32, period: float = 3600.0, seed: int = 0) -> tuple[dict, dict]:
    """``(behave, device)``: the two traces as dicts keyed by client id (strings, as JSON keeps them)."""
    rng = random.Random(seed)
    behave, device = {}, {}
    for c in range(clients):
        share = rng.uniform(0.25, 0.65)  # of the period online
        pieces = rng.randint(1, 3)
        cuts = sorted(rng.uniform(0.0, 1.0) for _ in range(pieces - 1))
        lengths = [share * period * (b - a) for a, b in zip([0.0, *cuts], [*cuts, 1.0])]
        gap = (1.0 - share) * period / pieces  # equal gaps between the pieces
        t = rng.uniform(0.0, period)
        intervals = []
        for length in lengths:
            intervals.append((t % period, t % period + length))
            t += length + gap
        flat = []  # an interval across the period's end is split in two, and the intervals sorted
        for a, b in intervals:
            flat += [(a, period), (0.0, b - period)] if b > period else [(a, b)]
        flat = sorted((round(a, 1), round(b, 1)) for a, b in flat)
        flat = [(a, b) for a, b in flat if a < b]
        behave[str(c)] = {"active": [a for a, _ in flat], "inactive": [b for _, b in flat], "finish_time": period}
        device[str(c)] = {"computation": round(40.0 * math.exp(0.7 * rng.gauss(0.0, 1.0)), 2),
                          "communication": round(math.exp(rng.uniform(math.log(500.0), math.log(20000.0))), 2)}
    return behave, device


def dumps(trace: dict) -> str:
    """The file's text: JSON, one client a line."""
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in trace.items()) + "\n}\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--period", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "configs" / "traces"))
    args = parser.parse_args(argv)
    behave, device = make(args.clients, args.period, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "synthetic_behave.json").write_text(dumps(behave))
    (out / "synthetic_device.json").write_text(dumps(device))
    print(f"wrote {out / 'synthetic_behave.json'} and {out / 'synthetic_device.json'} ({args.clients} clients)")


if __name__ == "__main__":
    main()
