"""Synchronous FedAvg against FedBuff and FedAsync on MNIST shards with heavy-tailed client durations (RESULTS.md).

One run per call (the shared machine's lock is taken per run by the caller):

    python benchmarks/studies/async_study.py RUN SEED [--steps S] [--out DIR]
    python benchmarks/studies/async_study.py --table [DIR]      # the RESULTS.md table from the runs' files
    python benchmarks/studies/async_study.py --protocol [--lock FILE]   # the fair protocol (below): runs what is missing
    python benchmarks/studies/async_study.py --protocol-table   # its RESULTS.md tables

The fair protocol (``--protocol``, the repository's ``benchmarks/studies/paper_protocol.py`` rule): 10% of the training
set is a server-side validation split no client trains on (``data.validation_fraction=0.1``); for every run the
client learning rate is chosen in :data:`LRS` on seed 0 by ``final/val_acc_last10pct`` (the validation accuracy
of the last 10% of evaluations), never the test set; the chosen rate then runs on seeds 1 and 2. Files go to
``benchmarks/results/async_protocol/<run>_lr<lr>_s<seed>.json``.

RUN is one of the keys of :data:`RUNS`. Every run: MNIST, 100 clients of 2 label shards each (McMahan et al.
2017's pathological split), the 2NN MLP (784-200-200-10), E = 1, B = 10, client lr 0.05, server SGD lr 1;
client durations from a log-normal clock (per-client speed exp(N(0, 1)), jitter exp(N(0, 0.1^2)), 1 s per
local step). The budget is 1,000 used client trainings (uploads): 100 server steps of M = 10, 1,000 of M = 1.
Synchronous FedAvg is FedBuff with C = M = 10 and s = 1 (lfed.core.asynchronous: the synchronous round, with the
round's simulated time the slowest client's). Writes ``<out>/<run>_s<seed>.json``: per evaluation the
server step, the uploads so far, the simulated time and the test accuracy.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import harness  # noqa: E402

CLOCK = {"class_path": "lfed.participation.clock.SimulatedClock",
         "init_args": {"distribution": "lognormal", "time_per_step": 1.0, "speed_sigma": 1.0, "jitter_sigma": 0.1}}

#: name -> (asynchronous init_args, class, server steps per 1,000 uploads, evaluate every)
RUNS = {
    "fedavg_sync": ("FedBuff", {"concurrency": 10, "buffer": 10, "staleness": "constant"}, 100, 10),
    "fedbuff_c20": ("FedBuff", {"concurrency": 20, "buffer": 10}, 100, 10),
    "fedbuff_c50": ("FedBuff", {"concurrency": 50, "buffer": 10}, 100, 10),
    "fedbuff_c100": ("FedBuff", {"concurrency": 100, "buffer": 10}, 100, 10),
    "fedasync_c10": ("FedAsync", {"concurrency": 10, "mixing": 0.6}, 1000, 100),
}


def table(out: Path) -> None:
    """The markdown table of RESULTS.md from the runs' files in ``out``: per run (mean ± sd over seeds) the test
    accuracy after 1,000 uploads, the simulated time of those 1,000 uploads, and the simulated time and uploads to
    first reach a target (the first evaluation at or above it): 0.85, and synchronous FedAvg's mean final accuracy
    minus 1 point."""
    import statistics as st

    runs: dict[str, list[dict]] = {}
    for path in sorted(out.glob("*.json")):
        r = json.loads(path.read_text())
        runs.setdefault(r["run"], []).append(r)
    if "fedavg_sync" not in runs:
        raise SystemExit("no fedavg_sync run yet")
    sync_target = round(st.mean(r["points"][-1]["acc"] for r in runs["fedavg_sync"]) - 0.01, 4)

    def ms(xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            return "not reached"
        return f"{st.mean(xs):.4g}" + (f" ± {st.stdev(xs):.2g}" if len(xs) > 1 else "")

    for target in (0.85, sync_target):
        print(f"\ntarget {target:.4f}" + (" (sync FedAvg's mean final accuracy - 0.01)" if target == sync_target else "") + "\n")
        print("| run | seeds | test acc at 1,000 uploads | simulated s for 1,000 uploads | simulated s to target | "
              "uploads to target | clients trained |")
        print("|---|---|---|---|---|---|---|")
        for name in RUNS:
            rs = runs.get(name)
            if not rs:
                continue
            hits = [next((p for p in r["points"] if p["acc"] >= target), None) for r in rs]
            print(f"| {name} | {','.join(str(r['seed']) for r in rs)} | {ms([r['points'][-1]['acc'] for r in rs])} | "
                  f"{ms([r['points'][-1]['time'] for r in rs])} | {ms([h['time'] if h else None for h in hits])} "
                  f"({sum(h is not None for h in hits)}/{len(rs)} reached) | {ms([h['uploads'] if h else None for h in hits])} | "
                  f"{ms([r['trained'] for r in rs])} |")
    print("\naccuracy against simulated time (seed 0; step: simulated s -> test acc):\n")
    for name in RUNS:
        r = next((r for r in runs.get(name, []) if r["seed"] == 0), None)
        if r:
            print(f"* {name}: " + ", ".join(f"{p['time']:.0f} s {p['acc']:.3f}" for p in r["points"]))


LRS = (0.03, 0.1, 0.3, 1.0)  # 1.0 added after every seed-0 run chose 0.3, the top of (0.03, 0.1, 0.3)
PROTOCOL_OUT = Path(__file__).resolve().parents[1] / "results" / "async_protocol"
PROTOCOL_RUNS = ("fedavg_sync", "fedbuff_c20", "fedbuff_c50", "fedbuff_c100", "fedasync_c10")


def _load(out: Path) -> dict[tuple[str, float, int], dict]:
    runs = {}
    for path in sorted(out.glob("*.json")):
        r = json.loads(path.read_text())
        runs[(r["run"], r["lr"], r["seed"])] = r
    return runs


def chosen_lr(runs: dict, name: str) -> float | None:
    """The client lr of :data:`LRS` with the best seed-0 ``final/val_acc_last10pct`` (None until all ran; a run
    that diverged scores -inf)."""
    scores = {}
    for lr in LRS:
        r = runs.get((name, lr, 0))
        if r is None:
            return None
        v = r.get("val_acc_last10pct")
        scores[lr] = v if v is not None and v == v else float("-inf")
    return max(LRS, key=lambda lr: (scores[lr], -lr))


def protocol(lock: str | None) -> None:
    """Run what the fair protocol still misses, one subprocess per run (under ``flock lock`` when given)."""
    import subprocess

    PROTOCOL_OUT.mkdir(parents=True, exist_ok=True)

    def run(name: str, lr: float, seed: int) -> None:
        if (name, lr, seed) in _load(PROTOCOL_OUT):
            return
        cmd = [sys.executable, __file__, name, str(seed), "--lr", str(lr), "--validation", "0.1", "--out", str(PROTOCOL_OUT)]
        if lock:
            cmd = ["flock", lock, *cmd]
        print(time.strftime("%H:%M:%S", time.gmtime()), "UTC", " ".join(cmd[-8:]), "load", os.getloadavg(), flush=True)
        subprocess.run(cmd, check=True)

    for name in PROTOCOL_RUNS:
        for lr in LRS:
            run(name, lr, 0)
    for seed in (1, 2):
        for name in PROTOCOL_RUNS:
            run(name, chosen_lr(_load(PROTOCOL_OUT), name), seed)


def protocol_table(out: Path = PROTOCOL_OUT) -> None:
    """The RESULTS.md tables of the fair protocol: the grid on seed 0 (validation), then the chosen lr on 3 seeds
    (test accuracy, simulated time and uploads to targets)."""
    import statistics as st

    runs = _load(out)
    print("client lr chosen on seed 0 by final/val_acc_last10pct (validation accuracy):\n")
    print("| run | " + " | ".join(f"lr {lr:g}" for lr in LRS) + " | chosen |")
    print("|---|" + "---|" * (len(LRS) + 1))
    chosen = {}
    for name in PROTOCOL_RUNS:
        cells = []
        for lr in LRS:
            r = runs.get((name, lr, 0))
            cells.append("-" if r is None else "diverged" if r.get("diverged") else f"{r['val_acc_last10pct']:.4f}")
        chosen[name] = chosen_lr(runs, name)
        edge = " (edge)" if chosen[name] in (LRS[0], LRS[-1]) else ""
        print(f"| {name} | " + " | ".join(cells) + f" | {chosen[name]}{edge} |")
    sel = {name: [runs[(name, chosen[name], s)] for s in (0, 1, 2) if (name, chosen[name], s) in runs]
           for name in PROTOCOL_RUNS if chosen[name] is not None}
    if not sel.get("fedavg_sync"):
        return

    def ms(xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            return "not reached"
        return f"{st.mean(xs):.4g}" + (f" ± {st.stdev(xs):.2g}" if len(xs) > 1 else "")

    sync_target = round(st.mean(r["points"][-1]["acc"] for r in sel["fedavg_sync"]) - 0.01, 4)
    for target in (0.85, sync_target):
        print(f"\ntarget {target:.4f}" + (" (sync FedAvg's mean final test accuracy - 0.01)" if target == sync_target else "")
              + "\n")
        print("| run | lr | seeds | test acc at 1,000 uploads | simulated s for 1,000 uploads | simulated s to target | "
              "uploads to target | clients trained | staleness mean |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, rs in sel.items():
            hits = [next((p for p in r["points"] if p["acc"] >= target), None) for r in rs]
            print(f"| {name} | {chosen[name]} | {','.join(str(r['seed']) for r in rs)} | "
                  f"{ms([r['points'][-1]['acc'] for r in rs])} | {ms([r['points'][-1]['time'] for r in rs])} | "
                  f"{ms([h['time'] if h else None for h in hits])} ({sum(h is not None for h in hits)}/{len(rs)} reached) | "
                  f"{ms([h['uploads'] if h else None for h in hits])} | {ms([r['trained'] for r in rs])} | "
                  f"{ms([r.get('staleness_mean') for r in rs])} |")
    print("\naccuracy against simulated time and uploads (seed 0 at the chosen lr; simulated s / uploads -> test acc):\n")
    for name, rs in sel.items():
        r = next((r for r in rs if r["seed"] == 0), None)
        if r:
            print(f"* {name}: " + ", ".join(f"{p['time']:.0f} s / {p['uploads']} {p['acc']:.3f}" for p in r["points"]))
    walls = [r["wall_s"] for r in runs.values()]
    print(f"\n{len(walls)} runs, {sum(walls) / 60:.1f} CPU-wall minutes in all")


def main() -> None:
    if sys.argv[1:2] == ["--protocol"]:
        protocol(sys.argv[3] if sys.argv[2:3] == ["--lock"] else None)
        return
    if sys.argv[1:2] == ["--protocol-table"]:
        protocol_table()
        return
    if sys.argv[1:2] == ["--table"]:
        table(Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parents[1] / "results" / "async_study")
        return
    parser = harness.parser(__doc__, quick=False)
    parser.add_argument("run", choices=sorted(RUNS))
    parser.add_argument("seed", type=int)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "async_study"))
    parser.add_argument("--steps", type=int, default=None, help="server steps (default: 1,000 uploads)")
    parser.add_argument("--lr", type=float, default=None, help="client learning rate (default 0.05; in the file name when given)")
    parser.add_argument("--validation", type=float, default=0.0, help="data.validation_fraction (the protocol: 0.1)")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    from lfed.lightning.cli import run_cli

    kind, init, steps, every = RUNS[args.run]
    steps = args.steps or steps
    init = {**init, "clock": CLOCK}
    cli_args = [
        "fit", "--seed_everything", str(args.seed),
        "--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(every), "--trainer.logger=false",
        "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu",
        f"--trainer.default_root_dir=/tmp/async_study/{args.run}_{args.seed}",
        "--model.net=lfed.models.zoo.MLP", "--model.net.init_args.in_features=784", "--model.net.init_args.hidden=[200,200]",
        "--model.net.init_args.num_classes=10", f"--model.training.client_lr={args.lr or 0.05}", "--model.training.batch_size=10",
        "--model.training.local_epochs=1", "--model.weighting=uniform", f"--model.seed={args.seed}",
        "--model.evaluation.round_local_accuracy=false",
        "--model.asynchronous", json.dumps({"class_path": f"lfed.core.asynchronous.{kind}", "init_args": init}),
        "--data.dataset=mnist", "--data.num_clients=100", "--data.partition=shards", "--data.shards_per_client=2",
        "--data.holdout_fraction=0.0", f"--data.validation_fraction={args.validation}",
    ]
    import lfed.core.asynchronous as la

    taus: list[float] = []  # every server step's mean staleness, read from what the step logs
    finish = la.Asynchronous.finish

    def recording(self, *a, **k):
        metrics, warnings = finish(self, *a, **k)
        taus.append(float(metrics["async/staleness_mean"]))
        return metrics, warnings

    la.Asynchronous.finish = recording
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (f"{args.run}_s{args.seed}.json" if args.lr is None else f"{args.run}_lr{args.lr:g}_s{args.seed}.json")
    t0 = harness.clock()
    try:
        cli = run_cli(cli_args)
    except FloatingPointError as e:  # diverged (NaN or Inf): a grid point that scores -inf, recorded as such
        path.write_text(json.dumps({"run": args.run, "seed": args.seed, "lr": args.lr or 0.05, "steps": steps,
                                    "wall_s": harness.clock() - t0, "load_end": os.getloadavg(), "diverged": str(e),
                                    "points": [], "val": [], "val_acc_last10pct": None}, indent=1))
        print(f"{args.run} seed {args.seed}: diverged ({e}) -> {path}", file=sys.stderr)
        return
    wall = harness.clock() - t0
    run = cli.model.runs[0]
    a = run.components.asynchronous
    uploads = {r: u for r, u, _ in run.comm.history}
    points = [{"step": r, "uploads": uploads.get(r), "time": a.times[r - 1], "acc": acc} for r, acc in run.eval_history]
    summary = run.summary()
    val = [{"step": r, "acc": acc} for r, acc in run.val_history]
    path.write_text(json.dumps({"run": args.run, "seed": args.seed, "lr": args.lr or 0.05, "steps": steps, "wall_s": wall,
                                "load_end": os.getloadavg(), "trained": a.seq, "points": points, "val": val,
                                "val_acc_last10pct": summary.get("final/val_acc_last10pct"),
                                "staleness_mean": sum(taus) / len(taus) if taus else None}, indent=1))
    print(f"{args.run} seed {args.seed}: {points[-1]} in {wall:.1f} s -> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
