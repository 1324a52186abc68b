"""Building a large population: partition and ``FederatedDataModule.build`` seconds as N grows.

Synthetic labels (10 classes), ``--examples`` examples per client, each partition scheme and the
data module's build (partition, held-out split, packing, label counts), each in a fresh process,
repeats interleaved, medians shown. Compare two versions of lfed by running it with each on
``PYTHONPATH``:

    python benchmarks/population_build.py --clients 10000,100000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone


def one(N: int, n: int) -> dict:
    import torch

    from lfed.data import partition as P
    from lfed.lightning.datamodule import FederatedDataModule

    g = torch.Generator().manual_seed(0)
    x = torch.randn(N * n + 100, 8, generator=g)
    y = torch.randint(0, 10, (N * n + 100,), generator=g)
    out = {}
    for scheme, kw in [("iid", {}), ("shards", {}), ("dirichlet", {"rho": 0.5}), ("classes", {})]:
        t = time.perf_counter()
        P.partition(y[100:], N, scheme, seed=0, **kw)
        out[scheme] = time.perf_counter() - t
    for holdout in (0.0, 0.2):
        dm = FederatedDataModule.from_tensors(x[100:], y[100:], x[:100], y[:100], num_clients=N, partition="iid",
                                              holdout_fraction=holdout, num_classes=10)
        t = time.perf_counter()
        dm.build()
        out[f"build (holdout {holdout})"] = time.perf_counter() - t
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", default="10000,100000")
    p.add_argument("--examples", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        N, n = json.loads(args.one)
        print("RESULT " + json.dumps(one(N, n)), flush=True)
        return
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}, {args.examples} examples/client, "
          f"{args.repeats} repeats, seconds (median)", flush=True)
    Ns = [int(v) for v in args.clients.split(",")]
    runs: dict[int, list[dict]] = {N: [] for N in Ns}
    for _ in range(args.repeats):
        for N in Ns:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", json.dumps([N, args.examples])],
                                  capture_output=True, text=True)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                sys.exit(proc.stderr)
            runs[N].append(json.loads(line[0][7:]))
    keys = list(runs[Ns[0]][0])
    print("| N | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for N in Ns:
        print(f"| {N:,} | " + " | ".join(f"{statistics.median(r[k] for r in runs[N]):.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
