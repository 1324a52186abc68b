"""Seconds per federated round of a config, per CohortTrainer backend (steady state, evaluation excluded).

    python benchmarks/round_seconds.py configs/quickstart.yaml --rounds 30
    LFED_DATA_DIR=../shared/data python benchmarks/round_seconds.py configs/fedavg_mnist.yaml --rounds 20

Runs the config through lfed's own CLI (no logger, no checkpoints), times every training step with a
callback, and prints the median over rounds after the first (which pays for backend selection),
plus the process start-up and data preparation time.
"""

from __future__ import annotations

import argparse
import statistics
import time

T0 = time.perf_counter()

from lightning.pytorch import Callback  # noqa: E402

from lfed.lightning.cli import LfedCLI  # noqa: E402
from lfed.lightning.datamodule import FederatedDataModule  # noqa: E402
from lfed.lightning.module import FederatedModule  # noqa: E402


class RoundTimer(Callback):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seconds.append(time.perf_counter() - self._t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--backends", nargs="+", default=["vmap", "loop"])
    a = p.parse_args()
    imports = time.perf_counter() - T0
    print(f"imports: {imports:.2f} s")
    print("| config | backend | s/round (median) | min | data+setup s |")
    print("|---|---|---|---|---|")
    for backend in a.backends:
        t = time.perf_counter()
        cli = LfedCLI(
            FederatedModule, FederatedDataModule, run=False, save_config_callback=None,
            args=["--config", a.config, "--trainer.max_steps", str(a.rounds), "--trainer.logger", "false",
                  "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "0",
                  "--checkpoint_every", "0", "--model.engine.backend", backend],
        )
        timer = RoundTimer()
        cli.trainer.callbacks.append(timer)
        cli.trainer.fit(cli.model, cli.datamodule)
        total = time.perf_counter() - t
        steady = timer.seconds[1:]
        print(f"| {a.config} | {backend} | {statistics.median(steady):.3f} | {min(steady):.3f} | "
              f"{total - sum(timer.seconds):.2f} |", flush=True)


if __name__ == "__main__":
    main()
