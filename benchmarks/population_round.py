"""CPU seconds of a round at population N (issue 65's job): 5 examples a client, MLP 16-32-10, K = 100, the
Lightning-free API (build_run + run_round), median of rounds 2..R, printed as one JSON line.

    ../shared/tools/quiet-run python benchmarks/population_round.py 1000000 6
    ../shared/tools/quiet-run env PYTHONPATH=<another checkout> python benchmarks/population_round.py 1000000 6

Process CPU time (time.process_time), so a shared machine skews it less than wall time; still run it below load 1.0
and interleave the versions compared (BENCHMARKS.md, "A round at population scale").
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(N: int, rounds: int) -> dict:
    from population_job import data_module, examples, issue65_run

    from lfed.core.fit import fit_run
    from lfed.core.round import run_round

    x, y = examples(N)
    t0 = time.process_time()
    dm = data_module(x, y, N)
    run = issue65_run(N)
    fit_run(run, dm, 1)  # builds the run (data, state) and trains round 0
    build = time.process_time() - t0
    w = run.layout.module_vector(run.net)
    times = []
    for r in range(1, rounds):
        t = time.process_time()
        w, _ = run_round(run.components, w, run.data, run.training_plan, run.engine, round=r, seed=0)
        times.append(time.process_time() - t)
    times.sort()
    return {"N": N, "build_cpu_s": round(build, 2), "round_cpu_s_median": times[len(times) // 2],
            "load": os.getloadavg()[0]}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 6)))
