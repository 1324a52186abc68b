"""FedAvg, FedProx and SCAFFOLD on FedProx's Synthetic(1, 1), 30 devices, with 0% and 90% stragglers (RESULTS.md).

The paper's setting (Li et al. 2020, §5.1, Figure 1; configs/fedprox_synthetic.yaml): multinomial logistic regression
60 -> 10, client lr 0.01, batch 10, E = 20 local epochs, 10 devices a round; lfed's stragglers
(``p_incomplete``: each sampled device independently completes U{1..T-1} of its T steps). What is measured is the
paper's: the training loss of the global model on all devices' training examples (``f(w) = sum_k p_k F_k(w)``, the
mean over the pooled training set), and the accuracy on all devices' test shares.

    OMP_NUM_THREADS=1 python scripts/fedprox_synthetic_study.py --rounds 50 --every 5 --seeds 0

Prints one line per evaluation, then a Markdown table; ``--json PATH`` also writes every curve, and
``--table A.json B.json`` prints the table of several such files together (seeds run in separate processes).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

from lfed.client.objectives import Prox
from lfed.core.fit import fit_run
from lfed.core.settings import build_run
from lfed.data.federated import FederatedDataset
from lfed.models import LogisticRegression

TRAINING = {"client_lr": 0.01, "batch_size": 10, "local_epochs": 20}

#: name -> (settings of build_run, straggler share)
METHODS = {
    "FedAvg, 0%": ({"algorithm": "fedavg"}, 0.0),
    "FedProx μ=1, 0%": ({"algorithm": "fedprox", "objective": Prox(mu=1.0)}, 0.0),
    "SCAFFOLD, 0%": ({"algorithm": "scaffold"}, 0.0),
    "FedAvg (drop), 90%": ({"algorithm": "fedavg", "partial_work": "drop"}, 0.9),
    "FedProx μ=0 (keep), 90%": ({"algorithm": "fedprox", "objective": Prox(mu=0.0)}, 0.9),
    "FedProx μ=1 (keep), 90%": ({"algorithm": "fedprox", "objective": Prox(mu=1.0)}, 0.9),
    "SCAFFOLD (keep), 90%": ({"algorithm": "scaffold", "partial_work": "keep"}, 0.9),
}


@torch.no_grad()
def global_scores(net, data) -> dict[str, float]:
    """Training loss on the pooled training set (FedProx's plotted loss), test loss and accuracy."""
    out = {}
    for split, x, y in (("train", data.train_x, data.train_y), ("test", data.test_x, data.test_y)):
        logits = net(x)
        out[f"{split}_loss"] = float(F.cross_entropy(logits.double(), y))
        out[f"{split}_acc"] = float((logits.argmax(-1) == y).double().mean())
    return out


def one_run(name: str, dataset: FederatedDataset, seed: int, rounds: int, every: int) -> list[dict]:
    settings, stragglers = METHODS[name]
    torch.manual_seed(seed)
    run = build_run(**settings, net=LogisticRegression(60, 10), fraction=10 / 30, training=TRAINING, seed=seed,
                    engine={"backend": "loop"}, stragglers={"p_incomplete": stragglers})
    curve = []
    while run.rounds_done < rounds:
        history = fit_run(run, dataset, every, total_rounds=rounds)
        scores = global_scores(run.net, dataset.build())
        skipped = sum(1 for h in history if h.get("round/skipped"))
        curve.append({"round": run.rounds_done, "skipped": skipped, **scores})
        print(f"{name} seed {seed} round {run.rounds_done}: train loss {scores['train_loss']:.4f} "
              f"test acc {scores['test_acc']:.4f}", flush=True)
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--table", nargs="+", default=None, metavar="JSON",
                        help="print the table of these --json files together (runs nothing)")
    args = parser.parse_args()
    if args.table:
        merged: dict[str, dict[str, list[dict]]] = {}
        for path in args.table:
            with open(path) as fh:
                saved = json.load(fh)
            for name, by_seed in saved["results"].items():
                merged.setdefault(name, {}).update({int(s): c for s, c in by_seed.items()})
        print(table(merged, saved["args"]["rounds"], saved["args"]["every"]))
        return
    dataset = FederatedDataset("synthetic", num_clients=30, partition="natural", holdout_fraction=0.0,
                               synthetic_alpha=1.0, synthetic_beta=1.0, seed=0)
    d = dataset.build()
    print(f"Synthetic(1, 1): {d.num_clients} devices, {d.train_y.numel()} training and {d.test_y.numel()} test "
          f"examples, sizes {sorted(d.client_sizes.tolist())}", flush=True)
    results: dict[str, dict[int, list[dict]]] = {}
    start, cpu = time.time(), time.process_time()
    for name in args.methods:
        for seed in args.seeds:
            results.setdefault(name, {})[seed] = one_run(name, dataset, seed, args.rounds, args.every)
    print(f"wall {time.time() - start:.0f} s, CPU {time.process_time() - cpu:.0f} s, "
          f"load average {os.getloadavg()}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=1)
    print(table(results, args.rounds, args.every))


def table(results: dict, rounds: int, every: int) -> str:
    """The Markdown table: mean ± std over the seeds of the last evaluation, of the worst training loss in the second
    half, and of the rounds in which no client counted (``round/skipped``)."""
    def cell(values: list[float], digits: int = 3) -> str:
        t = torch.tensor(values, dtype=torch.float64)
        return f"{float(t.mean()):.{digits}f}" + (f" ± {float(t.std()):.{digits}f}" if t.numel() > 1 else "")

    seeds = sorted({s for by_seed in results.values() for s in by_seed})
    lines = [f"| method | train loss, round {rounds} | worst train loss, rounds {rounds // 2 + every}-{rounds} | "
             f"test acc, round {rounds} | rounds skipped (of {rounds}) |", "|---|---|---|---|---|"]
    for name, by_seed in results.items():
        curves = [by_seed[s] for s in seeds if s in by_seed]
        lines.append(f"| {name} | {cell([c[-1]['train_loss'] for c in curves])} | "
                     f"{cell([max(e['train_loss'] for e in c if e['round'] > rounds // 2) for c in curves])} | "
                     f"{cell([c[-1]['test_acc'] for c in curves])} | "
                     f"{cell([sum(e['skipped'] for e in c) for c in curves], 1)} |")
    return f"{len(seeds)} seed(s): {seeds}\n" + "\n".join(lines)

if __name__ == "__main__":
    main()
