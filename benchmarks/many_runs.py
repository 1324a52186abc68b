"""Many runs, one engine: a client-lr x seed grid trained as one group against the same runs one after another.

    LFED_DATA_DIR=/work/shared/data python benchmarks/many_runs.py --rounds 5 --repeats 3
    LFED_DATA_DIR=/work/shared/data python benchmarks/many_runs.py --net cnn --dataset fashion_mnist --rounds 2

The grid is IGFL's client learning rates {1e-3, 3e-3, ..., 3e-1} x 3 seeds (``model.seed``:
cohorts, stragglers, batches) of ``--algorithm`` (IGFL by default) on the IGFL cross-device
config (``configs/paper/igfl/cross_device_mnist.yaml``: 100 clients, C = 0.1, B = 100, E = 1),
18 runs. Every repeat builds the 18 runs afresh (``lfed grid``'s own parsing) and times, in
turn (interleaved, each started on a quiet machine: :mod:`harness`):

* ``group``: one :class:`lfed.lightning.group.RunGroup` of all 18 runs under one Trainer (one engine call per round);
* ``one by one``: the same 18 runs one after another in this process, each a group of one
  (the same driver, so only the batching differs);
* ``lfed fit``: the same 18 runs one after another through ``lfed fit``'s own path
  (LightningCLI parsing and ``Trainer.fit``), in this process (no process start-up or imports paid);
* ``processes``: the same 18 runs as 18 ``lfed fit`` processes one after another, what a grid is
  without a group (a W&B agent or a shell loop): each pays the interpreter, the imports and the data.
  Its ``train s`` is an estimate: the processes' wall-clock less 18 times the seconds of one
  ``python -c 'import lfed.lightning.cli'`` (measured once per repeat); its ``total s`` is measured.

``train s`` is the training of all rounds and the final evaluation (the data loaded and the
runs built before the clock starts); ``total s`` adds building the runs and loading the data.
Runs per hour are from ``total s``. Evaluation: once, after the last round.
"""

from __future__ import annotations

import gc
import os
import resource

import harness
import torch

from lfed.lightning.grid import build_members, train_group
from lfed.lightning.sweep import Sweep

LRS = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3]
CNN = '{"class_path": "lfed.models.zoo.McMahanMNISTCNN", "init_args": {"num_classes": 10}}'


def overrides(a) -> list[str]:
    out = [f"--model.algorithm={a.algorithm}", f"--trainer.max_steps={a.rounds}", f"--trainer.val_check_interval={a.rounds}",
           f"--data.dataset={a.dataset}", f"--data.data_dir={a.data_dir}", "--trainer.accelerator=cpu"]
    if a.net == "cnn":
        out.append(f"--model.net={CNN}")
    if a.batch_size is not None:
        out.append(f"--model.training.batch_size={a.batch_size}")
    return out


def sweep(a) -> Sweep:
    return Sweep("many-runs", {"model.training.client_lr": LRS[: a.lrs], "model.seed": list(range(a.seeds))})


def run_group(a) -> tuple[float, float]:
    with harness.stopwatch() as total:
        members, trainer = build_members([a.config], sweep(a), overrides(a))
        with harness.stopwatch() as train:
            group, _ = train_group(members, **fit_args(trainer))  # set-up (data on the device, state) included
    assert all(m.status == "done" and m.round == a.rounds for m in group.members), [(m.name, m.error) for m in group.members]
    return train.seconds, total.seconds


def fit_args(trainer: dict) -> dict:
    return {"rounds": trainer["max_steps"], "evaluate_every": trainer["val_check_interval"],
            "precision": trainer.get("precision") or "32-true"}


def run_one_by_one(a) -> tuple[float, float]:
    train = 0.0
    with harness.stopwatch() as total:
        members, trainer = build_members([a.config], sweep(a), overrides(a))
        for m in members:
            with harness.stopwatch() as sw:
                train_group([m], **fit_args(trainer))
            train += sw.seconds
            assert m.status == "done" and m.round == a.rounds, m.error
    return train, total.seconds


def run_lfed_fit(a) -> tuple[float, float]:
    from lfed.lightning.cli import LfedCLI
    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.lightning.module import FederatedModule

    train = 0.0
    with harness.stopwatch() as total:
        for point in sweep(a).points():
            args = ["--config", a.config, *Sweep.args_of(point), *overrides(a), "--trainer.logger=false",
                    "--trainer.enable_progress_bar=false", "--checkpoint_every=0", "--trainer.default_root_dir=/tmp/lfed-many-runs"]
            cli = LfedCLI(FederatedModule, FederatedDataModule, run=False, args=args, save_config_callback=None)
            cli.datamodule.build()
            with harness.stopwatch() as sw:
                cli.trainer.fit(cli.model, datamodule=cli.datamodule)
            train += sw.seconds
    return train, total.seconds


def run_processes(a) -> tuple[float, float]:
    env = dict(os.environ, WANDB_MODE="disabled")
    startup = harness.measure(harness.python(["-c", "import lfed.lightning.cli"], env=env), quiet=False).median
    with harness.stopwatch() as sw:
        for point in sweep(a).points():
            harness.python(["-m", "lfed.lightning.cli", "fit", "--config", a.config, *Sweep.args_of(point), *overrides(a),
                            "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--checkpoint_every=0",
                            "--trainer.default_root_dir=/tmp/lfed-many-runs"], env=env)()
    return sw.seconds - len(sweep(a).points()) * startup, sw.seconds


MODES = {"group": run_group, "one by one": run_one_by_one, "lfed fit": run_lfed_fit, "processes": run_processes}


def main() -> None:
    p = harness.parser(__doc__, repeats=3)
    p.add_argument("--config", default="configs/paper/igfl/cross_device_mnist.yaml")
    p.add_argument("--algorithm", default="igfl")
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--net", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--data_dir", default=os.environ.get("LFED_DATA_DIR", "/work/shared/data"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--lrs", type=int, default=6)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=None, help="Client batch size (default: the config's, 100)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    a = p.parse_args()
    if a.quick:
        a.rounds, a.lrs, a.seeds, a.repeats, a.modes = 1, 1, 2, 1, ["group", "one by one"]
    runs = a.lrs * a.seeds
    print(f"{runs} runs ({a.algorithm}, {a.dataset}, {a.net}, B={a.batch_size or 'config'}), {a.rounds} rounds, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load {harness.loadavg():.2f}")

    def mode(name):
        out = MODES[name](a)
        gc.collect()  # a group's members hold reference cycles: free them before the next mode builds its own
        return out

    def log(name, r, train, load, out) -> None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux -> GiB, peak so far
        print(f"  repeat {r}: {name}: train {train:.1f} s, total {out[1]:.1f} s (load before {load:.2f}; "
              f"this process's peak RSS so far {peak:.1f} GiB)", flush=True)

    # every mode starts below load 1.0, the modes interleaved; a run's figure is its train s, its result (train, total)
    times = harness.interleave({m: (lambda m=m: mode(m)) for m in a.modes}, repeats=a.repeats, figure=lambda out: out[0], log=log)
    print(f"| mode | train s (median of {a.repeats}) | total s | runs / hour | speed-up (train) | speed-up (total) |")
    print("|---|---|---|---|---|---|")
    base = {m: t.median for m, t in times.items()}
    tot = {m: harness.Timing([out[1] for out in t.results]).median for m, t in times.items()}
    ref = "one by one" if "one by one" in a.modes else a.modes[-1]
    for m in a.modes:
        print(f"| {m} | {base[m]:.1f} | {tot[m]:.1f} | {3600 * runs / tot[m]:.0f} | "
              f"{base[ref] / base[m]:.2f}x | {tot[ref] / tot[m]:.2f}x |")
    print(f"load after: {harness.loadavg():.2f}")


if __name__ == "__main__":
    main()
