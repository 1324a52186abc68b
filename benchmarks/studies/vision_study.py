"""FedAvg and FedBN with a BatchNorm ResNet on non-IID FashionMNIST, with and without augmentation (issue 53).

    LFED_DATA_DIR=../shared/data nice -n 19 python benchmarks/studies/vision_study.py           # the study (cached)
    LFED_DATA_DIR=../shared/data python benchmarks/studies/vision_study.py --quick               # a smoke test

A CPU stand-in for the CIFAR tables of FL papers, stated as one: FashionMNIST (28x28, one channel), 20 clients
with a Dirichlet(0.3) label skew, 5 a round, 5 local steps of batch 32 at client lr 0.05, 30 rounds, the CIFAR
ResNet-20 of He et al. 2016 at width 8 with BatchNorm (``lfed.models.ResNet20(in_channels=1, width=8)``, 68,642
parameters; ResNet-18 at 11.2M parameters does not fit this 2-core CPU's budget), on the vmap backend (each client's
running statistics its own row). Arms: ``fedavg`` and ``fedbn`` x ``augment: none`` and ``crop_flip``, 3 seeds each
(the seed moves the partition, the initial model, the cohorts and the batches). No learning rate is tuned. Reported:
the global model's test accuracy, the global model's mean accuracy on the clients' own held-out splits, and (FedBN)
the personalized models' mean (each client's norm layers and statistics), after the last round; mean ± std over
the seeds. Each run is cached in ``benchmarks/results/vision/``; a rerun reads the cache. Not part of the test suite.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import harness  # noqa: E402
import torch  # noqa: E402

from lfed import FederatedDataset, LocalTraining, build_run, fit_run  # noqa: E402
from lfed.models import ResNet20  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "results" / "vision"
ARMS = [(a, g) for a in ("fedavg", "fedbn") for g in ("none", "crop_flip")]
KEYS = ("test/acc", "client/acc_mean", "personal/acc_mean")


def one_run(algorithm: str, augment: str, seed: int, rounds: int, quick: bool) -> dict:
    data = FederatedDataset(dataset="fashion_mnist", num_clients=20, partition="dirichlet", rho=0.3, seed=seed,
                            augment=augment)
    torch.manual_seed(seed)
    run = build_run(net=ResNet20(in_channels=1, width=4 if quick else 8), algorithm=algorithm, fraction=0.25, seed=seed,
                    training=LocalTraining(client_lr=0.05, batch_size=32, local_steps=2 if quick else 5))
    with harness.stopwatch() as sw:
        history = fit_run(run, data, rounds, evaluate_every=max(rounds // 2, 1))
    final = history[-1]
    return {"algorithm": algorithm, "augment": augment, "seed": seed, "rounds": rounds, "backend": run.engine.backend,
            "seconds": sw.seconds, **{k: final[k] for k in KEYS if k in final}}


def main() -> None:
    p = harness.parser(__doc__, quick_help="2 rounds, one seed, a narrower net (a smoke test; no cache)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    seeds, rounds = ([0], 2) if args.quick else (args.seeds, args.rounds)
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in seeds:
        for algorithm, augment in ARMS:
            path = OUT / f"{algorithm}-{augment}-seed{seed}-r{rounds}.json"
            if path.is_file() and not args.quick:
                r = json.loads(path.read_text())
            else:
                r = one_run(algorithm, augment, seed, rounds, args.quick)
                if not args.quick:
                    path.write_text(json.dumps(r, indent=1))
            print(json.dumps(r), flush=True)
            results.append(r)
    print("\n| method | augmentation | test acc | clients' held-out acc (global model) | personalized acc | s per run |")
    print("|---|---|---|---|---|---|")
    for algorithm, augment in ARMS:
        rs = [r for r in results if r["algorithm"] == algorithm and r["augment"] == augment]

        def cell(key, rs=rs):
            vals = [100 * r[key] for r in rs if key in r]
            if not vals:
                return "–"
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            return f"{statistics.mean(vals):.1f} ± {sd:.1f}"

        print(f"| {algorithm} | {augment} | {cell('test/acc')} | {cell('client/acc_mean')} | {cell('personal/acc_mean')} | "
              f"{statistics.mean(r['seconds'] for r in rs):.0f} |")
    print(f"\n{len(seeds)} seeds, {rounds} rounds, torch {torch.__version__}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
