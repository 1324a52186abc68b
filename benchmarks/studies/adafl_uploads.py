"""Uploads to reach a test accuracy on non-IID MNIST: FedAvg C=0.1, FedAvg C=0.5 and AdaFL.

AdaFL (Chen, Chong & Quek, shared/seeds/003) reports the rounds and cumulative client uploads
``Σ_t K_t`` each method needs to first reach 90% test accuracy on non-IID MNIST with an MLP and
100 clients: FedAvg-0.1 1008 (10080), FedAvg-0.5 570 (28500), AdaFL 423 (6690).

This script runs the same three methods through ``lfed fit`` on ``configs/paper/adafl_mnist.yaml``
(100 clients with 2 label shards each, MLP 784-200-200-10, B = 10, E = 1, client lr 0.05; see
the config for what the paper leaves open), each until it first reaches ``--target`` or has run
``--rounds`` rounds, evaluating the global model every ``--eval-every`` rounds. The paper's
AdaFL spends 200 rounds in each of its five fractions 0.1, 0.2, ..., 0.5; a CPU budget does not
allow 1000 rounds, so here AdaFL is the ``adafl`` preset: attention sampling (α = 0.9) with the
fraction stepping 0.1 -> 0.5 in five equal stages over the ``--rounds`` budget. The evaluation
grid makes "rounds to reach" exact only to a multiple of ``--eval-every``.

It writes every evaluation ``(method, rounds, uploads, test_acc, seconds)`` to a CSV file and
prints a table of rounds and uploads to each target (and the best accuracy of each run).

Example (the command behind benchmarks/results/adafl_uploads.md)::

    python benchmarks/studies/adafl_uploads.py --data-dir ../shared/data --rounds 100 --eval-every 2

This is a benchmark, not a test: a full run takes tens of minutes on a CPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import harness  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "paper" / "adafl_mnist.yaml"

#: The paper's MNIST numbers (003, Table "rounds (uploads)" to 90% and 91%).
PAPER = {
    "FedAvg-0.1": {0.90: (1008, 10080), 0.91: (2528, 25280)},
    "FedAvg-0.5": {0.90: (570, 28500), 0.91: (1232, 61600)},
    "AdaFL": {0.90: (423, 6690), 0.91: (761, 18440)},
}


def method_args(name: str) -> list[str]:
    """``lfed fit`` overrides of one method on top of the paper config."""
    if name == "FedAvg-0.1":
        return ["--model.algorithm", "fedavg", "--model.sampler", "uniform", "--model.fraction", "0.1"]
    if name == "FedAvg-0.5":
        return ["--model.algorithm", "fedavg", "--model.sampler", "uniform", "--model.fraction", "0.5"]
    if name == "AdaFL":
        schedule = {"class_path": "lfed.participation.sampling.StepwiseFraction", "init_args": {"start": 0.1, "end": 0.5, "stages": 5}}
        sampler = {"class_path": "lfed.participation.sampling.AttentionSampler", "init_args": {"alpha": 0.9}}
        return ["--model.algorithm", "adafl", "--model.sampler", json.dumps(sampler), "--model.fraction", json.dumps(schedule)]
    raise ValueError(f"method must be one of {tuple(PAPER)}, got {name!r}")


def cli_args(name: str, args: argparse.Namespace) -> list[str]:
    """The full ``lfed fit`` argument list of one run (stops at ``args.target``)."""
    return [
        "fit", "--config", str(CONFIG), *method_args(name),
        "--data.data_dir", str(args.data_dir),
        "--trainer.max_steps", str(args.rounds),
        "--trainer.val_check_interval", str(args.eval_every),
        "--trainer.accelerator", "cpu",
        "--trainer.logger", "false",
        "--trainer.enable_checkpointing", "false",
        "--trainer.enable_progress_bar", "false",
        "--model.seed", str(args.seed),
        "--model.evaluation.accuracy_targets", json.dumps(sorted(set(args.targets + [args.target]))),
        # stop as soon as the target is reached: later rounds cannot change "rounds to reach"
        "--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping",
        "--trainer.callbacks.monitor=test/acc",
        "--trainer.callbacks.mode=max",
        f"--trainer.callbacks.stopping_threshold={args.target}",
        "--trainer.callbacks.patience=1000000",
    ]


def run(name: str, args: argparse.Namespace) -> tuple[list[tuple[int, int, float]], float]:
    """One run; returns the evaluations ``(rounds, uploads, acc)`` and seconds per round."""
    from lfed.lightning.cli import run_cli

    with harness.stopwatch() as sw:
        cli = run_cli(cli_args(name, args))
    seconds = sw.seconds
    rounds = max(int(cli.trainer.global_step), 1)
    return list(cli.model.comm.history), seconds / rounds


def first_reach(history: list[tuple[int, int, float]], target: float) -> tuple[int, int] | None:
    from lfed.evaluation.communication import rounds_to_reach

    return rounds_to_reach(history, target)


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser(__doc__, quick=False, description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("LFED_DATA_DIR", str(REPO.parent / "shared" / "data")))
    parser.add_argument("--rounds", type=int, default=100, help="round budget per run (and AdaFL's schedule length)")
    parser.add_argument("--eval-every", type=int, default=2, help="rounds between test evaluations")
    parser.add_argument("--target", type=float, default=0.90, help="accuracy to reach (a run stops there)")
    parser.add_argument("--targets", type=float, nargs="*", default=[0.80, 0.85, 0.88], help="lower targets also reported")
    parser.add_argument("--methods", nargs="*", default=["FedAvg-0.1", "AdaFL", "FedAvg-0.5"], choices=list(PAPER))
    parser.add_argument("--seed", type=int, default=0, help="seed of sampling and batches (the partition is the config's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 avoids oversubscription on a shared CPU)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "adafl_uploads.csv"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("WANDB_MODE", "disabled")

    command = "python benchmarks/studies/adafl_uploads.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {}
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "rounds", "uploads", "test_acc", "seconds_per_round"])
        for name in args.methods:
            print(f"== {name}: lfed " + shlex.join(cli_args(name, args)), flush=True)
            history, per_round = run(name, args)
            results[name] = (history, per_round)
            for r, u, acc in history:
                writer.writerow([name, r, u, f"{acc:.4f}", f"{per_round:.3f}"])
            f.flush()
            best = max(history, key=lambda h: h[2])
            print(f"   {len(history)} evaluations, best {best[2]:.4f} after {best[0]} rounds, {per_round:.2f} s/round", flush=True)

    targets = sorted(set(args.targets + [args.target]))
    header = "| method | s/round | best acc (round) | " + " | ".join(f"to {t:.0%}: rounds (uploads)" for t in targets)
    header += " | paper to 90% |"
    print()
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, (history, per_round) in results.items():
        best = max(history, key=lambda h: h[2])
        cells = []
        for t in targets:
            hit = first_reach(history, t)
            cells.append("not reached" if hit is None else f"{hit[0]} ({hit[1]})")
        paper = PAPER[name][0.90]
        print(
            f"| {name} | {per_round:.2f} | {best[2]:.4f} ({best[0]}) | " + " | ".join(cells) + f" | {paper[0]} ({paper[1]}) |"
        )
    print(f"\nrounds budget {args.rounds}, evaluation every {args.eval_every} rounds, seed {args.seed}, "
          f"torch threads {args.threads}; raw history: {out}")
    print(f"command: {command}")


if __name__ == "__main__":
    main()
