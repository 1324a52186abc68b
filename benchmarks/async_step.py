"""The cost of an asynchronous server step against a synchronous round of the same cohort size (BENCHMARKS.md).

    python benchmarks/async_step.py [--repeats 3] [--steps 30] [--accelerator cpu|cuda]

MNIST, 100 clients (shards), the 2NN MLP, E = 1, B = 10, CPU. Synchronous FedAvg with K = 10 against FedBuff
with M = 10 and C = 100 (in steady state each server step dispatches and trains 10 clients, like the round,
and pops 10 stored results from the host store). The time of each training step (round or server step) is
taken between Lightning's batch hooks; the figure of a run is the median over steps 5.., the figure reported
the median of ``repeats`` runs, the two kinds taken in turn (sync, fedbuff, sync, ...). Also: the bytes of C = 1,000 in-flight results in host placement
(``ClientStateStore.nbytes``). Prints the load average before and after; quote it only at load < 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from lightning.pytorch.callbacks import Callback


class StepTimes(Callback):
    def __init__(self) -> None:
        self.times: list[float] = []
        self._t = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self._t)


def one(kind: str, steps: int, accelerator: str = "cpu") -> float:
    from lightning.pytorch import Trainer

    from lfed.core.asynchronous import FedBuff
    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.lightning.module import FederatedModule
    from lfed.models.zoo import MLP
    from lfed.participation.clock import SimulatedClock

    torch.manual_seed(0)
    net = MLP(in_features=784, hidden=[200, 200], num_classes=10)
    common = dict(training={"client_lr": 0.05, "batch_size": 10, "local_epochs": 1},
                  evaluation={"round_local_accuracy": False})
    if kind == "sync":
        module = FederatedModule(net, fraction=0.1, **common)
    else:
        module = FederatedModule(net, engine={"client_state": "host"}, asynchronous=FedBuff(
            concurrency=100, buffer=10, clock=SimulatedClock("lognormal")), **common)
    dm = FederatedDataModule(dataset="mnist", num_clients=100, partition="shards", shards_per_client=2,
                             holdout_fraction=0.0)
    timer = StepTimes()
    trainer = Trainer(max_steps=steps, accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, callbacks=[timer])
    trainer.fit(module, datamodule=dm)
    return statistics.median(timer.times[5:])


def host_bytes(concurrency: int, num_params: int) -> int:
    from lfed.core.asynchronous import FedBuff
    from lfed.state.stores import ClientStateStore

    a = FedBuff(concurrency=concurrency, buffer=10)
    store = ClientStateStore("host")
    store.register_owner("asynchronous", a)
    a.setup_state(store, torch.zeros(5000), num_params, torch.zeros(1))
    a.write_rows("update", torch.arange(concurrency), torch.ones(concurrency, num_params))
    return sum(store.nbytes().values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    from quiet import wait_quiet

    out = {"threads": torch.get_num_threads(), "accelerator": args.accelerator}
    runs: dict[str, list[float]] = {"sync": [], "fedbuff": []}
    loads: dict[str, list[float]] = {"sync": [], "fedbuff": []}  # the 1-minute load before each run (after waiting)
    for _ in range(args.repeats):
        for kind in runs:
            loads[kind].append(round(wait_quiet()[0], 2))
            runs[kind].append(one(kind, args.steps, args.accelerator))
    for kind, times in runs.items():
        out[kind] = {"medians_s": times, "median_s": statistics.median(times), "load_1min_before": loads[kind]}
    out["ratio"] = out["fedbuff"]["median_s"] / out["sync"]["median_s"]
    out["host_bytes_C1000_P199210"] = host_bytes(1000, 199_210)
    out["load_1min_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
