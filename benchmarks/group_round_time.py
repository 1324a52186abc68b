"""Seconds per lock-step round of a grid trained as one group, steady state: the one driver against lfed 0.2's.

    LFED_DATA_DIR=../shared/data python benchmarks/group_round_time.py --rounds 8
    PYTHONPATH=<a checkout of lfed 0.2> LFED_DATA_DIR=../shared/data python benchmarks/group_round_time.py --rounds 8

The grid of ``benchmarks/many_runs.py`` (IGFL, 6 client lrs x 3 seeds, IGFL cross-device MNIST, MLP
2NN, 18 runs). Each round is timed on its own: with the one driver (lfed >= 0.3, ``RunGroup`` under a
Lightning ``Trainer``) from ``on_train_batch_start`` to ``on_train_batch_end`` (the round, the
runs' logging through Lightning, and the loop's bookkeeping), with lfed 0.2's ``RunGroup.step``
(its own loop) around each call (:mod:`harness`). Evaluation only after the last round, which is not timed.
Prints the median of rounds 2.. (round 1 records the engine's step) and the load average before the run (after
waiting for a quiet machine).
Run each version in its own process, interleaved, on a quiet machine (``../shared/tools/quiet-run``).
"""

from __future__ import annotations

import os
import sys

import harness
import torch

import lfed.lightning.group

LRS = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3]


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--config", default="configs/paper/igfl/cross_device_mnist.yaml")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--data_dir", default=os.environ.get("LFED_DATA_DIR", "/work/shared/data"))
    a = p.parse_args()
    from lfed.lightning.grid import build_members
    from lfed.lightning.sweep import Sweep

    rounds = 3 if a.quick else a.rounds
    sweep = Sweep("round-time", {"model.training.client_lr": LRS[:1] if a.quick else LRS, "model.seed": [0, 1, 2]})
    overrides = ["--model.algorithm=igfl", f"--trainer.max_steps={rounds}", f"--trainer.val_check_interval={rounds}",
                 "--data.dataset=mnist", f"--data.data_dir={a.data_dir}", "--trainer.accelerator=cpu"]
    load = harness.wait_quiet()[0]
    members, second = build_members([a.config], sweep, overrides)
    if hasattr(lfed.lightning.group.RunGroup, "step"):  # lfed 0.2: the group's own loop
        group = lfed.lightning.group.RunGroup(members, dtype=second, log=None, checkpoint_every=0)
        group.setup()
        group._open_logs()
        seconds = harness.measure(group.step, repeats=rounds, quiet=False).samples
        driver = "lfed 0.2 RunGroup.step"
    else:
        from lfed.lightning.grid import train_group

        clock = harness.step_clock()
        train_group(members, rounds=rounds, evaluate_every=rounds, callbacks=[clock])
        seconds = clock.seconds
        driver = "one driver (RunGroup under a Trainer)"
    steady = harness.Timing(seconds[1:]).median
    print(f"{driver}: {len(members)} runs, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load before {load:.2f}: steady s/round {steady:.3f} (rounds: {', '.join(f'{s:.3f}' for s in seconds)})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
