"""Against peers on an identical job: lfed, Flower (simulation, Ray) and Apple's pfl, one run.

The job (McMahan et al. 2017's MNIST 2NN setting): FedAvg, 100 clients from lfed's shards
partition (2 shards of 300 label-sorted examples each), 10 clients per round, E = 1, B = 10,
client lr 0.05, server lr 1, MLP 784-200-200-10, 50 rounds, one test evaluation after the last
round. This script

1. exports lfed's partition (``partition.npy``: ``[100, 600]`` indices into the MNIST training
   set) and MNIST as lfed loads it (float32 in [0, 1]) to ``--work`` as ``.npy`` files; the peer
   jobs read these, so all three train the same clients on the same examples;
2. runs each framework's job script (``benchmarks/peers/*_job.py``) as a fresh process, each in
   its own Python environment, ``--repeats`` times in rotating order, each started on a quiet machine
   (:mod:`harness`; the process's wall time is its figure) (``pfl_2proc``: pfl's job as
   2 worker processes under ``torchrun --standalone``, pfl's own distributed simulation; torchrun
   gives each worker 1 thread);
3. reports per framework the median over repeats of: total wall-clock of the process (start-up
   included: interpreter, imports, data, set-up, 50 rounds, the final evaluation), start-up to
   the first round, steady seconds per round (median of rounds 2..50 within a run) and final
   test accuracy, and the ratios lfed / peer.

    python benchmarks/peers_mnist.py --flower-python /tmp/bench_flwr/bin/python \\
        --pfl-python /tmp/bench_pfl/bin/python --repeats 3

Peers live in throwaway virtual environments (see BENCHMARKS.md for the exact installs); a
framework whose interpreter is not given (or fails) is reported as missing with its error.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = {"lfed": "lfed_job.py", "lfed_loop": "lfed_job.py", "flower": "flower_job.py", "pfl": "pfl_job.py", "pfl_2proc": "pfl_job.py",
        "plain_vmap": "plain_vmap_job.py", "plain_loop": "plain_loop_job.py",
        "lfed_dp": "lfed_job.py", "pfl_dp": "pfl_job.py"}  # *_dp: DP-FedAvg with --dp-noise / --dp-clip  # plain_*: hand-written references


def export(work: str, data_dir: str | None, clients: int, seed: int) -> None:
    """Write lfed's MNIST tensors and shards partition as ``.npy`` files for the peers."""
    import numpy as np

    from lfed import FederatedDataModule

    dm = FederatedDataModule(dataset="mnist", data_dir=data_dir, num_clients=clients, partition="shards",
                             shards_per_client=2, holdout_fraction=0.0, seed=seed)
    d = dm.build()
    if not bool((d.client_sizes == d.client_sizes[0]).all()):
        raise ValueError("the shards partition is expected to give every client the same number of examples")
    os.makedirs(work, exist_ok=True)
    arrays = {
        "train_x": d.train_x.reshape(d.train_x.shape[0], -1).numpy().astype(np.float32),
        "train_y": d.train_y.numpy().astype(np.int64),
        "test_x": d.test_x.reshape(d.test_x.shape[0], -1).numpy().astype(np.float32),
        "test_y": d.test_y.numpy().astype(np.int64),
        "partition": d.client_index.numpy().astype(np.int64),
    }
    for name, arr in arrays.items():
        np.save(os.path.join(work, f"{name}.npy"), arr)


def run_job(framework: str, python: str, args: argparse.Namespace) -> dict:
    """One run of ``framework``'s job: its ``RESULT`` (or the error); the harness times the process."""
    cmd = [python, os.path.join(HERE, "peers", JOBS[framework]), "--rounds", str(args.rounds), "--seed", str(args.seed)]
    if framework == "pfl_2proc":  # pfl's own multi-worker simulation: 2 processes under torchrun (1 thread each)
        cmd = [os.path.join(os.path.dirname(python), "torchrun"), "--standalone", "--nproc_per_node=2", *cmd[1:]]
    if framework.endswith("_dp"):
        cmd += ["--dp-noise", str(args.dp_noise), "--dp-clip", str(args.dp_clip)]
        cmd += ["--dp-delta", str(args.dp_delta)] if args.dp_delta is not None else []
    if framework.startswith("lfed"):
        cmd += ["--partition", os.path.join(args.work, "partition.npy"), "--clients", str(args.clients),
                "--fraction", str(args.cohort / args.clients)]
        if args.data_dir:
            cmd += ["--data-dir", args.data_dir]
        if framework == "lfed_loop":
            cmd += ["--backend", "loop"]
        elif args.lfed_backend:
            cmd += ["--backend", args.lfed_backend]
    else:
        cmd += ["--data", args.work]
        if framework.startswith("pfl"):
            cmd += ["--cohort", str(args.cohort)]
        elif framework.startswith("plain"):
            cmd += ["--per-round", str(args.cohort)]
    if framework == "flower":
        cmd += ["--cpus-per-client", str(args.flower_cpus)]
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=os.path.join(HERE, "peers"))
    for item in args.env:  # the same environment for every framework (e.g. OMP_NUM_THREADS=1)
        key, _, value = item.partition("=")
        env[key] = value
    if framework.startswith("lfed"):
        env["PYTHONPATH"] = os.path.dirname(HERE)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(harness.RESULT)]
    if proc.returncode != 0 or not lines:
        return {"framework": framework, "error": (proc.stderr or proc.stdout)[-3000:], "cmd": " ".join(cmd)}
    res = harness.result_line(proc.stdout)
    res["steady_round_s"] = statistics.median(res["round_s"][1:]) if len(res["round_s"]) > 1 else res["round_s"][0]
    return res


def main() -> None:
    p = harness.parser(__doc__, repeats=3, out=None, out_flags=("--json",), out_help="also write every run's result here")
    p.add_argument("--work", default="/tmp/lfed_peers", help="where the exported data go")
    p.add_argument("--data-dir", default=None, help="MNIST folder for lfed (default $LFED_DATA_DIR)")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--cohort", type=int, default=10, help="clients per round (DP: the expected cohort qN of Poisson sampling)")
    p.add_argument("--dp-noise", type=float, default=1.0, help="noise multiplier z of the *_dp jobs")
    p.add_argument("--dp-clip", type=float, default=0.5, help="clip C of the *_dp jobs")
    p.add_argument("--dp-delta", type=float, default=None, help="delta of the *_dp jobs (default 1/N^1.1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frameworks", default="lfed,lfed_loop,flower,pfl,plain_vmap,plain_loop")
    p.add_argument("--lfed-python", default=sys.executable)
    p.add_argument("--flower-python", default=None)
    p.add_argument("--pfl-python", default=None)
    p.add_argument("--lfed-backend", default=None, help="lfed's backend (default: auto)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set for every framework's process (e.g. OMP_NUM_THREADS=1, OMP_WAIT_POLICY=PASSIVE); repeatable")
    p.add_argument("--flower-cpus", type=float, default=1.0, help="Flower client_resources num_cpus per ClientApp")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args()
    if args.quick:
        args.rounds, args.repeats = 2, 1

    export(args.work, args.data_dir, args.clients, args.seed)
    pythons = {"lfed": args.lfed_python, "lfed_loop": args.lfed_python, "flower": args.flower_python, "pfl": args.pfl_python,
               "pfl_2proc": args.pfl_python, "lfed_dp": args.lfed_python, "pfl_dp": args.pfl_python,
               "plain_vmap": sys.executable, "plain_loop": sys.executable}
    frameworks = [f for f in args.frameworks.split(",") if f]
    missing = {f: f"no interpreter given (--{f}-python)" for f in frameworks if not pythons.get(f)}
    active = [f for f in frameworks if f not in missing]
    print(f"{harness.machine_line()}; {args.rounds} rounds, {args.repeats} repeats; env {args.env or 'defaults'}; "
          f"Flower num_cpus per client {args.flower_cpus}", flush=True)

    def log(f, r, wall, load, res) -> None:
        if "error" in res:
            print(f"{f}: FAILED\n{res['error']}", flush=True)
            return
        eps = f" epsilon {res['epsilon']:.4f} (delta {res['delta']:.3g})" if "epsilon" in res else ""
        print(f"repeat {r} load {load:.2f}: {f:6s} total {res['total_s']:.2f}s (process {wall:.2f}s) "
              f"start-up {res['startup_s']:.2f}s steady {res['steady_round_s']:.3f}s/round "
              f"acc {res['test_acc']:.4f}{eps}", flush=True)

    timings = harness.interleave({f: (lambda f=f: run_job(f, pythons[f], args)) for f in active}, repeats=args.repeats,
                                 order="rotate", log=log)
    runs: dict[str, list[dict]] = {}
    for f, t in timings.items():
        runs[f] = [{**res, "process_wall_s": wall, "load_before": load, "waited_s": waited}
                   for res, wall, load, waited in zip(t.results, t.samples, t.loads, t.waits)]
    summary = {}
    for f, rs in runs.items():
        ok = [x for x in rs if "error" not in x]
        if not ok:
            missing[f] = rs[0]["error"] if rs else "not run"
            continue
        med = lambda key, ok=ok: statistics.median(x[key] for x in ok)  # noqa: E731
        summary[f] = {"process_wall_s": med("process_wall_s"), "total_s": med("total_s"), "startup_s": med("startup_s"),
                      "steady_round_s": med("steady_round_s"), "test_acc": med("test_acc"), "runs": len(ok),
                      "version": ok[0].get("version"), "threads": ok[0].get("threads"), "torch": ok[0].get("torch"),
                      "epsilon": ok[0].get("epsilon"), "delta": ok[0].get("delta")}
    print("\n| framework | wall-clock, process (s) | start-up (s) | steady s/round | test acc | lfed / this, wall | lfed / this, s/round |")
    print("|---|---|---|---|---|---|---|")
    base = summary.get("lfed")
    for f, s in summary.items():
        ratio = (f"{base['process_wall_s'] / s['process_wall_s']:.2f}" if base else "-",
                 f"{base['steady_round_s'] / s['steady_round_s']:.2f}" if base else "-")
        name = f + (f" {s['version']}" if s.get("version") else "")
        print(f"| {name} | {s['process_wall_s']:.2f} | {s['startup_s']:.2f} | {s['steady_round_s']:.3f} | "
              f"{s['test_acc']:.4f} | {ratio[0]} | {ratio[1]} |")
    for f, why in missing.items():
        print(f"| {f} | missing: {why.strip().splitlines()[-1] if why.strip() else why} | | | | | |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"summary": summary, "missing": missing, "runs": runs}, fh, indent=1)


if __name__ == "__main__":
    main()
