"""Building a large population: partition and ``FederatedDataModule.build`` seconds as N grows.

Synthetic labels (10 classes), ``--examples`` examples per client, each partition scheme and the
data module's build (partition, held-out split, packing, label counts), each in a fresh process,
repeats interleaved, each started on a quiet machine (:mod:`harness`), medians shown. Compare two versions of lfed by running it with each on
``PYTHONPATH``:

    python benchmarks/population_build.py --clients 10000,100000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import harness


def one(N: int, n: int) -> dict:
    import torch

    from lfed.data import partition as P
    from lfed.lightning.datamodule import FederatedDataModule

    g = torch.Generator().manual_seed(0)
    x = torch.randn(N * n + 100, 8, generator=g)
    y = torch.randint(0, 10, (N * n + 100,), generator=g)
    out = {}
    for scheme, kw in [("iid", {}), ("shards", {}), ("dirichlet", {"rho": 0.5}), ("classes", {})]:
        with harness.stopwatch() as sw:
            P.partition(y[100:], N, scheme, seed=0, **kw)
        out[scheme] = sw.seconds
    for holdout in (0.0, 0.2):
        dm = FederatedDataModule.from_tensors(x[100:], y[100:], x[:100], y[:100], num_clients=N, partition="iid",
                                              holdout_fraction=holdout, num_classes=10)
        with harness.stopwatch() as sw:
            dm.build()
        out[f"build (holdout {holdout})"] = sw.seconds
    return out


def main() -> None:
    p = harness.parser(__doc__, repeats=3)
    p.add_argument("--clients", default="10000,100000")
    p.add_argument("--examples", type=int, default=5)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        N, n = json.loads(args.one)
        harness.print_result(one(N, n))
        return
    if args.quick:
        args.clients, args.repeats = "1000", 1
    print(f"{harness.machine_line()}, {args.examples} examples/client, {args.repeats} repeats, seconds (median)", flush=True)
    Ns = [int(v) for v in args.clients.split(",")]
    runs = harness.interleave({N: harness.python([os.path.abspath(__file__), "--one", json.dumps([N, args.examples])])
                               for N in Ns}, repeats=args.repeats)
    keys = list(harness.result_line(runs[Ns[0]].results[0]))
    print("| N | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for N in Ns:
        parts = [harness.result_line(out) for out in runs[N].results]
        print(f"| {N:,} | " + " | ".join(f"{statistics.median(r[k] for r in parts):.2f}" for k in keys) + " |")
    print(f"load before each run: {harness.load_range(harness.all_loads(runs.values()))}")


if __name__ == "__main__":
    main()
