"""SCAFFOLD and IGFL-C against FedAvg on MNIST with a Dirichlet(ρ = 0.1) label skew.

The cross-device setting of IGFL (000, §5): MNIST split over 100 clients by the Dirichlet
partition of SPEC §8 with ρ = 0.1 (per-class concentration 0.01: most clients hold one or two
labels), C = 0.1 (10 clients a round), the MLP 2NN (784-200-200-10, 199,210 parameters),
E = 1 local epoch of mini-batch SGD, the same client learning rate for every algorithm, server
SGD with learning rate 1 (SCAFFOLD's η_s = 1). Everything else is each preset's own choice
(lfed.core.registry): FedAvg size weights; SCAFFOLD uniform weights (as its paper); IGFL-C size
weights and the plain mean. All runs share the seed, so they see the same partition, cohorts
and batch order.

Reported per algorithm: the mean test accuracy over the last 10% of rounds (IGFL's figure;
the global model is evaluated after every round of that last 10%, and every ``--eval-every``
rounds before), the best accuracy seen, the final training loss, wall time, and, for the
objectives with state, the size of that state at the end (SCAFFOLD ``‖c‖`` and the mean
``‖c_k‖`` over clients that took part; IGFL-C the mean ``‖Δw_k‖`` and ``‖Δw_ps‖``), next to
the global model's norm and its last change, to see whether the corrections are of a
sensible magnitude.

Run (the defaults; about 16 minutes on a shared, busy 2-core CPU, one torch thread)::

    LFED_DATA_DIR=../shared/data python benchmarks/studies/objectives_mnist.py \\
        --rounds 150 --batch-size 50 --client-lr 0.05

Result of that command (lfed 8cc0fff, CPU, float32; accuracy = mean over the 15 evaluations
of rounds 136-150)::

    algorithm  acc last 10%  (evals)  best acc train loss  time s  state
    fedavg           84.83%       15    87.42%     0.1035     278  {'w_norm': 13.3408}
    scaffold         90.66%       15    91.23%     0.2176     355  {'w_norm': 14.1685, 'c_norm': 0.1023, 'c_k_norm_mean': 1.8628}
    igfl_c           94.12%       15    96.08%     0.0361     340  {'w_norm': 19.933, 'global_change_norm': 0.1817, 'prev_update_norm_mean': 0.2721}

(``train loss`` is the clients' mean local loss over their steps in the last 10 rounds:
SCAFFOLD's correction pulls each client away from its own optimum, so its local loss is
higher while the global model is better. IGFL-C's step is ``(1 + 1/|S|) η`` on the gradient
plus ``Δw_ps / T`` per step, so part of its lead is a larger effective step and server-side
momentum, as 000 §3.2 discusses; this benchmark does not tune η per algorithm.)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import harness  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Callback, Trainer, seed_everything  # noqa: E402

from lfed.lightning.datamodule import FederatedDataModule  # noqa: E402
from lfed.lightning.module import FederatedModule  # noqa: E402
from lfed.models.zoo import MLP  # noqa: E402

ALGORITHMS = ("fedavg", "scaffold", "igfl_c")


class EvalSchedule(Callback):
    """Evaluate every ``every`` rounds, and after every round of the last ``share`` of the run."""

    def __init__(self, rounds: int, every: int, share: float = 0.1) -> None:
        self.rounds, self.every = rounds, every
        self.tail_start = rounds - max(1, math.ceil(share * rounds))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        done = trainer.global_step  # rounds finished
        if done % self.every == 0 or done > self.tail_start:
            module.eval()
            with torch.no_grad():
                module.on_validation_epoch_start()
                for i, b in enumerate(trainer.datamodule.val_dataloader()):
                    module.validation_step([t.to(module.device) for t in b], i)
                sums = torch.stack(module._eval_sums).sum(0)
            module.train()
            module.eval_history.append((done, float(sums[1] / sums[2])))


def run(algorithm: str, args: argparse.Namespace) -> dict:
    seed_everything(args.seed, workers=False, verbose=False)
    dm = FederatedDataModule(
        dataset="mnist", data_dir=args.data_dir, num_clients=100, partition="dirichlet", rho=args.rho,
        holdout_fraction=0.0, seed=args.seed,
    )
    net = MLP(in_features=784, hidden=[200, 200], num_classes=10)
    module = FederatedModule(
        net, algorithm=algorithm, fraction=0.1,
        training=dict(client_lr=args.client_lr, batch_size=args.batch_size, local_epochs=args.epochs), seed=args.seed,
    )
    trainer = Trainer(
        max_steps=args.rounds, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        precision="32-true", callbacks=[EvalSchedule(args.rounds, args.eval_every)],
    )
    losses: list[float] = []

    class LossLog(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            loss = trainer.callback_metrics.get("train/loss")
            if loss is not None:
                losses.append(float(loss))

    trainer.callbacks.append(LossLog())
    with warnings.catch_warnings(), harness.stopwatch() as sw:
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    seconds = sw.seconds
    accs = [a for _, a in module.eval_history]
    out = {
        "algorithm": algorithm,
        "last10": module.last_rounds_accuracy(0.1),
        "tail_evals": sum(1 for r, _ in module.eval_history if r > args.rounds - max(1, math.ceil(0.1 * args.rounds))),
        "best": max(accs),
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "seconds": seconds,
        "w_norm": float(module.layout.module_vector(module.net).norm()),
    }
    if module.needs_history:
        out["global_change_norm"] = float(module.global_change.norm())
    obj = module.objective
    if obj.name == "scaffold":
        ck = obj.client_control
        touched = ck.abs().sum(1) > 0
        out["c_norm"] = float(obj.control.norm())
        out["c_k_norm_mean"] = float(ck[touched].norm(dim=1).mean())
    if obj.name == "igfl":
        prev = module.previous_update
        touched = prev.abs().sum(1) > 0
        out["prev_update_norm_mean"] = float(prev[touched].norm(dim=1).mean())
    return out


def main() -> None:
    p = harness.parser(__doc__, quick=False)
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--client-lr", type=float, default=0.05)
    p.add_argument("--rho", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=os.environ.get("LFED_DATA_DIR"))
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is fastest on a shared, busy CPU)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for name in args.algorithms:
        r = run(name, args)
        results.append(r)
        print(f"done {name}: {r}", flush=True)
    print()
    print(
        f"MNIST, Dirichlet rho={args.rho}, 100 clients, C=0.1, MLP 2NN, E={args.epochs}, B={args.batch_size}, "
        f"client lr={args.client_lr}, {args.rounds} rounds, seed={args.seed}"
    )
    print(f"{'algorithm':<10} {'acc last 10%':>12} {'(evals)':>8} {'best acc':>9} {'train loss':>10} {'time s':>7}  state")
    for r in results:
        state = {k: round(v, 4) for k, v in r.items() if k in ("c_norm", "c_k_norm_mean", "prev_update_norm_mean", "global_change_norm", "w_norm")}
        print(
            f"{r['algorithm']:<10} {100 * r['last10']:>11.2f}% {r['tail_evals']:>8d} {100 * r['best']:>8.2f}% "
            f"{r['final_loss']:>10.4f} {r['seconds']:>7.0f}  {state}"
        )


if __name__ == "__main__":
    main()
