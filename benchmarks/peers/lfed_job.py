"""Job 2 in lfed: FedAvg, MNIST, 100 shard clients, 10 per round, E = 1, B = 10, lr 0.05, MLP 2NN.

Run by ``benchmarks/peers_mnist.py`` (one fresh process per repeat) and printed as one JSON
line starting with ``RESULT``. Start-up (imports, data loading and partitioning, model and
Trainer construction) counts in ``total_s``; ``round_s`` are the wall-clock intervals between
the ends of consecutive rounds; the test set is evaluated once, after the last round.

    python benchmarks/peers/lfed_job.py --rounds 50 --partition /tmp/peers/partition.npy
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

os.environ.setdefault("WANDB_MODE", "disabled")


def main() -> None:
    p = harness.parser(__doc__, quick=False)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--fraction", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="auto")
    p.add_argument("--data-dir", default=None, help="folder with mnist/*.gz (default $LFED_DATA_DIR)")
    p.add_argument("--partition", default=None, help=".npy of the exported partition: checked equal to lfed's")
    p.add_argument("--profile", default=None, help="write a cProfile of the rounds to this file")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="the 2NN (default) or McMahan et al.'s MNIST CNN")
    p.add_argument("--dp-noise", type=float, default=None, help="DP-FedAvg with this noise multiplier z (Poisson sampling)")
    p.add_argument("--dp-clip", type=float, default=0.5, help="DP-FedAvg's clip C")
    p.add_argument("--dp-delta", type=float, default=None, help="DP-FedAvg's delta (default 1/N^1.1)")
    args = p.parse_args()

    import torch
    from lightning.pytorch import Callback, Trainer

    from lfed import FederatedDataModule, FederatedModule
    from lfed.models.zoo import MLP, McMahanMNISTCNN

    t_import = harness.clock()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dm = FederatedDataModule(
        dataset="mnist", data_dir=args.data_dir, num_clients=args.clients, partition="shards",
        shards_per_client=2, holdout_fraction=0.0, seed=args.seed, eval_batch_size=10000,
    )
    dp = {}
    if args.dp_noise is not None:  # DP-FedAvg (SPEC §10): Poisson sampling at q = fraction, uniform weights, m = qN
        from lfed.privacy import DPFedAvg

        dp = {"algorithm": "dp_fedavg", "combination": DPFedAvg(noise_multiplier=args.dp_noise, clip=args.dp_clip,
                                                                 delta=args.dp_delta)}
    module = FederatedModule(
        MLP(784, (200, 200), 10) if args.model == "mlp" else McMahanMNISTCNN(), **({"algorithm": "fedavg"} | dp),
        fraction=args.fraction, training=dict(client_lr=args.lr, batch_size=args.batch_size, local_epochs=args.epochs),
        engine=dict(backend=args.backend), seed=args.seed,
    )
    ends: list[float] = []
    marks: dict[str, float] = {}
    clients: list[float] = []  # DP: the realised Poisson cohort of every round

    class Clock(Callback):
        def on_train_start(self, *a, **k) -> None:
            marks["train_start"] = harness.clock()

        def on_train_batch_end(self, trainer, *a, **k) -> None:
            ends.append(harness.clock())
            if dp:
                clients.append(float(trainer.callback_metrics["privacy/clients"]))

    trainer = Trainer(
        max_steps=args.rounds, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        check_val_every_n_epoch=None, val_check_interval=args.rounds, callbacks=[Clock()],
    )
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    trainer.fit(module, datamodule=dm)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    t_end = harness.clock()
    acc = float(trainer.callback_metrics["test/acc"])
    matches = None
    if args.partition:
        import numpy as np

        part = np.load(args.partition)
        d = dm.build()
        matches = bool(np.array_equal(part, d.client_index.numpy()))
    rounds = [b - a for a, b in zip([marks["train_start"]] + ends[:-1], ends)]
    harness.print_result({
        "framework": "lfed_dp" if dp else "lfed", "total_s": t_end - T_START, "import_s": t_import - T_START,
        "startup_s": marks["train_start"] - T_START, "eval_s": t_end - ends[-1],
        "round_s": rounds, "test_acc": acc, "backend": module.engine.backend, "partition_matches": matches,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        **({"epsilon": float(trainer.callback_metrics["privacy/epsilon"]), "delta": dp["combination"].delta,
            "clients_per_round": [int(c) for c in clients]} if dp else {}),
    })


if __name__ == "__main__":
    main()
