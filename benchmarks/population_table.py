"""Issue 65's table: a population of N clients at the cost of its cohort, before and after, in one sitting.

The job of issue 65: 5 examples a client (16 features), MLP 16-32-10, K = 100 clients a round, one local step
of batch 5, the Lightning-free API (``build_run`` + ``fit_run`` + ``run_round``), held-out share 0.2 (each client one
of its 5 examples: what the client-level evaluation scores). Each (version, N) runs in a fresh process that prints:

* ``build CPU s``: ``FederatedDataModule.build`` (partition, held-out split, label counts) in process CPU seconds;
* ``peak RSS GB``: the process's peak resident memory after the build, less what it held before it (the imports and
  the pooled examples: ``ru_maxrss``);
* ``round CPU s``: the median over rounds 1..R-1 of ``run_round`` (round 0, with the run's state set up, excluded);
* ``evaluation CPU s``: one ``FederatedRun.evaluate`` (test set, the clients' held-out splits: every client's in
  lfed 0.5, a seeded sample of ``evaluation.client_sample`` = 10,000 since);
* ``checkpoint MB``: ``torch.save`` of what lfed's checkpoint holds of a FedAvg run and its data (the net's weights,
  the run's extra state, the data module's ``state_dict``): a Lightning checkpoint less Lightning's own entries.

Versions are checkouts put first on ``PYTHONPATH`` (``--version name=path``); the runs are interleaved (version, then
N, order flipped every repeat), each started below load 1.0 (:mod:`harness`), medians of ``--repeats``:

    python benchmarks/population_table.py --clients 1000,100000,1000000,10000000 --repeats 3 \\
        --version 0.5=/tmp/v05 --version now=.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys

import harness

HERE = os.path.dirname(os.path.abspath(__file__))


def one(N: int, rounds: int) -> dict:
    import resource
    import time
    import warnings

    import torch
    from population_job import data_module, examples, issue65_run

    from lfed.core.fit import fit_run
    from lfed.core.round import run_round
    from lfed.engine.ranks import Ranks

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    x, y = examples(N)
    dm = data_module(x, y, N, holdout=0.2)
    rss0, t = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
    dm.build()
    build = time.process_time() - t
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 2**20  # KiB -> GiB
    run = issue65_run(N)
    fit_run(run, dm, 1)  # the run's state set up, round 0 trained
    w = run.layout.module_vector(run.net)
    times = []
    for r in range(1, rounds):
        t = time.process_time()
        w, _ = run_round(run.components, w, run.data, run.training_plan, run.engine, round=r, seed=0)
        times.append(time.process_time() - t)
    t = time.process_time()
    metrics, _ = run.evaluate(Ranks(), lambda v: v)
    evaluation = time.process_time() - t
    state = {"net": run.net.state_dict(), "run": run.extra_state(), "data": dm.state_dict()}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return {"build CPU s": build, "peak RSS GB": rss, "round CPU s": statistics.median(times),
            "evaluation CPU s": evaluation, "checkpoint MB": buffer.tell() / 1e6,
            "client/evaluated": metrics.get("client/evaluated", float(N))}


def main() -> None:
    p = harness.parser(__doc__, repeats=3)
    p.add_argument("--clients", default="1000,100000,1000000,10000000")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--version", action="append", default=[], help="name=path of a checkout (first on PYTHONPATH)")
    p.add_argument("--one", default=None)
    args = p.parse_args()
    if args.one is not None:
        harness.print_result(one(*json.loads(args.one)))
        return
    versions = dict(v.split("=", 1) for v in (args.version or ["now=."]))
    Ns = [1000, 10000] if args.quick else [int(v) for v in args.clients.split(",")]
    jobs = {}
    for N in Ns:  # the versions of one N side by side, the order flipped every repeat
        for name, path in versions.items():
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(path), HERE]))
            jobs[(name, N)] = harness.python([os.path.abspath(__file__), "--one", json.dumps([N, args.rounds])], env=env)

    def log(key, repeat, seconds, load, out) -> None:
        print(f"repeat {repeat + 1} {key[0]} N={key[1]:,} (load {load:.2f}): {json.dumps(harness.result_line(out))}",
              flush=True)

    runs = harness.interleave(jobs, repeats=args.repeats, order="flip", log=log)
    print(f"{harness.machine_line()}, {args.repeats} repeats, medians (loads at each run's start in brackets)")
    keys = ("build CPU s", "peak RSS GB", "round CPU s", "evaluation CPU s", "checkpoint MB")
    print("| version | N | " + " | ".join(keys) + " | clients evaluated |")
    print("|---|---|" + "---|" * (len(keys) + 1))
    for (name, N), timing in runs.items():
        parts = [harness.result_line(out) for out in timing.results]
        cells = [statistics.median(r[k] for r in parts) for k in keys]
        print(f"| {name} | {N:,} | " + " | ".join(harness.cell(c, 3) for c in cells)
              + f" | {int(parts[0]['client/evaluated']):,} |  loads {harness.load_range(timing.loads)}")
    print(f"load before each run: {harness.load_range(harness.all_loads(runs.values()))}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
