"""What DP-FedAvg costs per round: the same job with and without DP, steady seconds per round, interleaved.

    LFED_DATA_DIR=../shared/data ../shared/tools/quiet-run python benchmarks/dp_cost.py --rounds 12 --repeats 3

The job of ``configs/dp_mnist.yaml``: MNIST, 1,000 IID clients, Poisson sampling at q = 0.1 (100
clients expected per round), MLP 2NN, one local epoch of batch 10. ``no DP``: the same sampler and
uniform weights with FedAvg's mean; ``DP``: ``dp_fedavg`` with z = 1.0, C = 0.5 (clipping, noise,
fixed denominator, accountant); ``DP adaptive``: the same with adaptive clipping. Each round is
timed from ``on_train_batch_start`` to ``on_train_batch_end``; steady = median of the rounds after
the first. The settings alternate within each repeat, each in a fresh module; the load average is
printed before each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from lightning.pytorch import Callback, Trainer

from lfed import FederatedDataModule, FederatedModule
from lfed.models.zoo import MLP
from lfed.privacy import DPFedAvg

SETTINGS = {
    "no DP": lambda: dict(algorithm="fedavg", sampler="poisson", weighting="uniform"),
    "DP": lambda: dict(algorithm="dp_fedavg", combination=DPFedAvg(noise_multiplier=1.0, clip=0.5)),
    "DP adaptive": lambda: dict(algorithm="dp_fedavg", combination=DPFedAvg(noise_multiplier=1.0, clip=0.5,
                                                                            target_quantile=0.5)),
}


class Clock(Callback):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_train_batch_start(self, *args) -> None:
        self.t = time.perf_counter()

    def on_train_batch_end(self, *args) -> None:
        self.seconds.append(time.perf_counter() - self.t)


def one(name: str, data: FederatedDataModule, rounds: int) -> float:
    torch.manual_seed(0)
    module = FederatedModule(MLP(784, [200, 200], 10), fraction=0.1, training=dict(client_lr=0.1, batch_size=10, local_epochs=1),
                             seed=0, **SETTINGS[name]())
    clock = Clock()
    Trainer(max_steps=rounds, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock]).fit(
        module, datamodule=data)
    return statistics.median(clock.seconds[1:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data_dir", default=os.environ.get("LFED_DATA_DIR"))
    a = p.parse_args()
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from quiet import wait_quiet

    data = FederatedDataModule(dataset="mnist", data_dir=a.data_dir, num_clients=1000, partition="iid")
    data.build()
    results: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for r in range(a.repeats):
        for name in SETTINGS:
            load, _ = wait_quiet()
            s = one(name, data, a.rounds)
            results[name].append(s)
            print(f"repeat {r + 1} {name:12s} load before {load:.2f}: steady {s:.4f} s/round", flush=True)
    base = statistics.median(results["no DP"])
    print("\n| setting | s/round (median of repeats) | vs no DP |\n|---|---|---|")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"| {name} | {med:.4f} | {med / base:.3f}x |")


if __name__ == "__main__":
    main()
