"""Seconds per federated round of a config, per CohortTrainer backend (steady state, evaluation excluded).

    python benchmarks/round_seconds.py configs/quickstart.yaml --rounds 30
    LFED_DATA_DIR=../shared/data python benchmarks/round_seconds.py configs/fedavg_mnist.yaml --rounds 20

Runs the config through lfed's own CLI (no logger, no checkpoints), times every training step with
:func:`harness.step_clock`, and prints the median over rounds after the first (which pays for backend selection),
plus the process start-up and data preparation time. Each backend's run starts on a quiet machine; the load is
printed after the table.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import harness  # noqa: E402

from lfed.lightning.cli import LfedCLI  # noqa: E402
from lfed.lightning.datamodule import FederatedDataModule  # noqa: E402
from lfed.lightning.module import FederatedModule  # noqa: E402


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("config")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--backends", nargs="+", default=["vmap", "loop"])
    a = p.parse_args()
    rounds = 3 if a.quick else a.rounds
    imports = harness.clock() - T0
    print(f"imports: {imports:.2f} s")
    print("| config | backend | s/round (median) | min | data+setup s |")
    print("|---|---|---|---|---|")
    loads = []
    for backend in a.backends:
        loads.append(harness.wait_quiet()[0])
        with harness.stopwatch() as total:
            cli = LfedCLI(
                FederatedModule, FederatedDataModule, run=False, save_config_callback=None,
                args=["--config", a.config, "--trainer.max_steps", str(rounds), "--trainer.logger", "false",
                      "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "0",
                      "--checkpoint_every", "0", "--model.engine.backend", backend],
            )
            timer = harness.step_clock()
            cli.trainer.callbacks.append(timer)
            cli.trainer.fit(cli.model, cli.datamodule)
        steady = timer.seconds[1:]
        print(f"| {a.config} | {backend} | {timer.steady(1):.3f} | {min(steady):.3f} | "
              f"{total.seconds - sum(timer.seconds):.2f} |", flush=True)
    print(f"load before each backend's run: {harness.load_range(loads)}")


if __name__ == "__main__":
    main()
