"""What DP-FedAvg costs per round: the same job with and without DP, steady seconds per round, interleaved.

    LFED_DATA_DIR=../shared/data ../shared/tools/quiet-run python benchmarks/dp_cost.py --rounds 12 --repeats 3

The job of ``configs/dp_mnist.yaml``: MNIST, 1,000 IID clients, Poisson sampling at q = 0.1 (100
clients expected per round), MLP 2NN, one local epoch of batch 10. ``no DP``: the same sampler and
uniform weights with FedAvg's mean; ``DP``: ``dp_fedavg`` with z = 1.0, C = 0.5 (clipping, noise,
fixed denominator, accountant); ``DP adaptive``: the same with adaptive clipping. Each round is
timed from ``on_train_batch_start`` to ``on_train_batch_end`` (:func:`harness.step_clock`); steady = median of
the rounds after the first. The settings alternate within each repeat, each in a fresh module, each started on a
quiet machine; the load average is printed before each.
"""

from __future__ import annotations

import os

import harness
import torch
from lightning.pytorch import Trainer

from lfed import FederatedDataModule, FederatedModule
from lfed.models.zoo import MLP
from lfed.privacy import DPFedAvg

SETTINGS = {
    "no DP": lambda: dict(algorithm="fedavg", sampler="poisson", weighting="uniform"),
    "DP": lambda: dict(algorithm="dp_fedavg", combination=DPFedAvg(noise_multiplier=1.0, clip=0.5)),
    "DP adaptive": lambda: dict(algorithm="dp_fedavg", combination=DPFedAvg(noise_multiplier=1.0, clip=0.5,
                                                                            target_quantile=0.5)),
}


def one(name: str, data: FederatedDataModule, rounds: int) -> float:
    torch.manual_seed(0)
    module = FederatedModule(MLP(784, [200, 200], 10), fraction=0.1, training=dict(client_lr=0.1, batch_size=10, local_epochs=1),
                             seed=0, **SETTINGS[name]())
    clock = harness.step_clock()
    Trainer(max_steps=rounds, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock]).fit(
        module, datamodule=data)
    return clock.steady(1)


def main() -> None:
    p = harness.parser(__doc__, repeats=3)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--data_dir", default=os.environ.get("LFED_DATA_DIR"))
    a = p.parse_args()
    rounds, repeats, clients = (2, 1, 200) if a.quick else (a.rounds, a.repeats, 1000)  # 200: adaptive clipping needs qN > 10
    data = FederatedDataModule(dataset="mnist", data_dir=a.data_dir, num_clients=clients, partition="iid")
    data.build()

    def log(name, r, s, load, _):
        print(f"repeat {r + 1} {name:12s} load before {load:.2f}: steady {s:.4f} s/round", flush=True)

    results = harness.interleave({name: (lambda name=name: one(name, data, rounds)) for name in SETTINGS},
                                 repeats=repeats, figure=float, log=log)
    base = results["no DP"].median
    print("\n| setting | s/round (median of repeats) | vs no DP |\n|---|---|---|")
    for name, t in results.items():
        print(f"| {name} | {t.median:.4f} | {t.median / base:.3f}x |")


if __name__ == "__main__":
    main()
