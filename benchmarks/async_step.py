"""The cost of an asynchronous server step against a synchronous round of the same cohort size (BENCHMARKS.md).

    python benchmarks/async_step.py [--repeats 3] [--steps 30] [--accelerator cpu|cuda]

MNIST, 100 clients (shards), the 2NN MLP, E = 1, B = 10, CPU. Synchronous FedAvg with K = 10 against FedBuff
with M = 10 and C = 100 (in steady state each server step dispatches and trains 10 clients, like the round,
and pops 10 stored results from the host store). The time of each training step (round or server step) is
taken between Lightning's batch hooks; the figure of a run is the median over steps 5.., the figure reported
the median of ``repeats`` runs, the two kinds taken in turn (sync, fedbuff, sync, ...), each started on a quiet
machine (:mod:`harness`). Also: the bytes of C = 1,000 in-flight results in host placement
(``ClientStateStore.nbytes``). Prints the load average before each run and after; quote it only at load < 1.
"""

from __future__ import annotations

import json
import os

import harness
import torch


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
    timer = harness.step_clock(torch.cuda.synchronize if torch.cuda.is_available() else None)
    trainer = Trainer(max_steps=steps, accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, callbacks=[timer])
    trainer.fit(module, datamodule=dm)
    return timer.steady(min(5, steps - 1))


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
    parser = harness.parser(__doc__, repeats=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    steps, repeats = (3, 1) if args.quick else (args.steps, args.repeats)
    os.environ.setdefault("WANDB_MODE", "disabled")
    out = {"threads": torch.get_num_threads(), "accelerator": args.accelerator}
    runs = harness.interleave({kind: (lambda kind=kind: one(kind, steps, args.accelerator)) for kind in ("sync", "fedbuff")},
                              repeats=repeats, figure=float)
    for kind, t in runs.items():  # the 1-minute load before each run (after waiting)
        out[kind] = {"medians_s": t.samples, "median_s": t.median, "load_1min_before": [round(x, 2) for x in t.loads]}
    out["ratio"] = out["fedbuff"]["median_s"] / out["sync"]["median_s"]
    out["host_bytes_C1000_P199210"] = host_bytes(1000, 199_210)
    out["load_1min_after"] = round(harness.loadavg(), 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
