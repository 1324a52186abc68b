"""OpenMP thread settings against lfed's round time: quiet machine vs one competing CPU-bound process.

Job 2 of BENCHMARKS.md (FedAvg, MNIST, 100 shard clients, 10 per round, E = 1, B = 10, lr 0.05) with
the 2NN or McMahan et al.'s MNIST CNN, on lfed's ``vmap`` and ``loop`` backends, each setting in a
fresh process (``benchmarks/peers/lfed_job.py``; OpenMP reads its environment when torch loads).
Settings:

* ``default``: the environment as a user has it (no ``OMP_*`` variable; torch's threads = cores);
* ``PASSIVE``: ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep at once; lfed 0.1 set this on import);
* ``ACTIVE``: ``OMP_WAIT_POLICY=ACTIVE`` (idle threads spin);
* ``1 thread``: ``OMP_NUM_THREADS=1``;
* ``spin 10k``: ``GOMP_SPINCOUNT=10000`` (libgomp's idle threads spin 10,000 iterations, not its
  default 300,000, before they sleep: a middle way).

``--compete`` adds one CPU-bound process (a Python busy loop) for the whole of each run: a shared
machine. Settings, backends and models are interleaved (rotating, :mod:`harness`); each cell is the median over
``--repeats`` of the steady seconds per round (median of rounds 2..R within a run). Every run starts on a quiet
machine, and its 1-minute load average is printed (a quiet machine has load < 1 before the competing process
starts).

    LFED_DATA_DIR=../shared/data python benchmarks/thread_policy.py --repeats 3
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import time

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = {
    "default": {},
    "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"},
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "spin 10k": {"GOMP_SPINCOUNT": "10000"},
}


def run(model: str, backend: str, setting: str, rounds: int, data_dir: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "GOMP_"))}
    env.update(SETTINGS[setting], WANDB_MODE="disabled", PYTHONPATH=os.path.dirname(HERE))
    cmd = [sys.executable, os.path.join(HERE, "peers", "lfed_job.py"), "--rounds", str(rounds),
           "--model", model, "--backend", backend]
    if data_dir:
        cmd += ["--data-dir", data_dir]
    res = harness.result_line(harness.command(cmd, env=env)())
    res["steady_round_s"] = statistics.median(res["round_s"][1:])
    return res


def cell(cond: str, model: str, backend: str, setting: str, rounds: int, data_dir: str | None) -> dict:
    """One run of ``run``; under ``compete`` with one busy process beside it for the whole run."""
    busy = None
    if cond == "compete":
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(1.0)
    try:
        return run(model, backend, setting, rounds, data_dir)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def main() -> None:
    p = harness.parser(__doc__, repeats=3, out=None, out_flags=("--json",), out_help="also write every run's figure here")
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--backends", default="vmap,loop")
    p.add_argument("--settings", default="default,PASSIVE,ACTIVE,1 thread,spin 10k")
    p.add_argument("--conditions", default="quiet,compete", help="quiet and/or compete (one busy process beside)")
    p.add_argument("--rounds-mlp", type=int, default=12)
    p.add_argument("--rounds-cnn", type=int, default=5)
    p.add_argument("--data-dir", default=None)
    a = p.parse_args()
    if a.quick:
        a.models, a.backends, a.settings, a.conditions, a.rounds_mlp, a.repeats = "mlp", "vmap", "default", "quiet", 2, 1
    cells = list(itertools.product(a.conditions.split(","), a.models.split(","), a.backends.split(","),
                                   a.settings.split(",")))

    def log(c, r, steady, load, res) -> None:
        cond, model, backend, setting = c
        print(f"repeat {r} load {load:.2f} | {cond:7s} {model} {backend:4s} {setting:8s} "
              f"steady {steady:.3f} s/round (threads {res['threads']}, acc {res['test_acc']:.3f})", flush=True)

    # quiet before every run (the competing process starts after); the cells rotate: no fixed order
    runs = harness.interleave({c: (lambda c=c: cell(*c, a.rounds_mlp if c[1] == "mlp" else a.rounds_cnn, a.data_dir))
                               for c in cells}, repeats=a.repeats, order="rotate", figure=lambda res: res["steady_round_s"], log=log)
    print("\n| condition | model | backend | " + " | ".join(a.settings.split(",")) + " |")
    print("|---|---|---|" + "---|" * len(a.settings.split(",")))
    for cond, model, backend in itertools.product(a.conditions.split(","), a.models.split(","), a.backends.split(",")):
        row = [runs[(cond, model, backend, s)].median for s in a.settings.split(",")]
        best = min(row)
        cells_txt = [f"**{v:.3f}**" if v == best else f"{v:.3f}" for v in row]
        print(f"| {cond} | {model} | {backend} | " + " | ".join(cells_txt) + " |")
    print(f"load before each run: {harness.load_range(harness.all_loads(runs.values()))}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({" / ".join(k): t.samples for k, t in runs.items()}, fh, indent=1)


if __name__ == "__main__":
    main()
