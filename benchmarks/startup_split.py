"""Where a command's start-up goes: interpreter, imports, build, first round (issue 51 item 14).

    python benchmarks/startup_split.py --repeats 3

Three commands, each in fresh processes, interleaved (the order flipping every repeat), each started below a 1-minute
load of 1.0 (up to ``$QUIET_WAIT`` s, :mod:`harness`), medians of ``--repeats``:

* ``lfed fit --config configs/quickstart.yaml`` for one round (no logger, checkpoint or progress bar): the
  interpreter (the process's wall time before the script's first line), ``import lfed.lightning.cli``, the build
  (the CLI's parse, the data, the module, the Trainer, up to ``on_train_start``), and the first round (to
  ``on_train_batch_end``); "interpreter" is the rest of the process's wall time: Python's start and exit;
* a ``fit_run`` script of the quickstart's run (``FederatedDataset`` + ``build_run`` + ``fit_run``, no Lightning):
  interpreter, ``from lfed import ...``, the build (data and run), the first round (``fit_run`` of one round, its
  set-up and the evaluation after it included);
* ``lfed fit --help``: the wall time.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import harness

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
QUICK = ["--config", str(REPO / "configs" / "quickstart.yaml"), "--trainer.max_steps=1", "--trainer.logger=false",
         "--trainer.enable_progress_bar=false", "--checkpoint_every=0", "--trainer.val_check_interval=1"]


def child_cli(root: str) -> dict:
    t0 = harness.clock()
    from lightning.pytorch import Callback

    from lfed.lightning.cli import run_cli
    t1 = harness.clock()
    marks: dict[str, float] = {}

    class Marks(Callback):
        def on_train_start(self, *a):
            marks.setdefault("built", harness.clock())

        def on_train_batch_end(self, *a):
            marks.setdefault("round", harness.clock())

    import lfed.lightning.cli as cli_module

    original = cli_module.LfedCLI.instantiate_trainer

    def with_marks(self, **kwargs):
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), Marks()]
        return original(self, **kwargs)

    cli_module.LfedCLI.instantiate_trainer = with_marks
    run_cli(["fit", *QUICK, f"--trainer.default_root_dir={root}"])
    return {"imports": t1 - t0, "build": marks["built"] - t1, "first round": marks["round"] - marks["built"], "total": harness.clock() - t0}


def child_fit_run() -> dict:
    t0 = harness.clock()
    from lfed import FederatedDataset, LocalTraining, build_run, fit_run
    from lfed.models import MLP
    t1 = harness.clock()
    data = FederatedDataset(dataset="digits", num_clients=20, partition="dirichlet", rho=0.5)
    data.build()
    run = build_run(net=MLP(in_features=64, hidden=(200, 200), num_classes=10), algorithm="fedavg", fraction=0.25,
                    training=LocalTraining(client_lr=0.05, batch_size=10, local_epochs=1))
    t2 = harness.clock()
    fit_run(run, data, 1)
    t3 = harness.clock()
    return {"imports": t1 - t0, "build": t2 - t1, "first round": t3 - t2, "total": t3 - t0,
            "lightning imported": any(m == "lightning" or m.startswith("lightning.") for m in sys.modules)}


def main() -> None:
    p = harness.parser(__doc__, repeats=3, description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=["cli", "fit_run"])
    p.add_argument("--root", default="/tmp/startup_split")
    args = p.parse_args()
    if args.child:
        harness.print_result(child_cli(args.root) if args.child == "cli" else child_fit_run())
        return
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    cmds = {"lfed fit, quickstart, 1 round": [__file__, "--child", "cli"], "fit_run script, 1 round": [__file__, "--child", "fit_run"],
            "lfed fit --help": ["-m", "lfed", "fit", "--help"]}
    runs = harness.interleave({name: harness.python(cmd, cwd=REPO, env=env) for name, cmd in cmds.items()},
                              repeats=1 if args.quick else args.repeats, order="flip")
    res: dict[str, list[dict]] = {}
    for name, t in runs.items():  # the process's wall time, and the parts the child measured (when it prints them)
        res[name] = []
        for wall, stdout in zip(t.samples, t.results):
            row = {"wall": wall, **(harness.result_line(stdout) if harness.RESULT in stdout else {})}
            if "total" in row:
                row["interpreter"] = wall - row["total"]
            res[name].append(row)
    print("| command | interpreter | imports | build | first round | wall |")
    print("|---|---|---|---|---|---|")
    for name, rows in res.items():
        def med(key, rows=rows):
            vals = [r[key] for r in rows if key in r]
            return f"{statistics.median(vals):.2f} s" if vals else "–"
        print(f"| {name} | {med('interpreter')} | {med('imports')} | {med('build')} | {med('first round')} | {med('wall')} |")
    light = [r.get("lightning imported") for r in res["fit_run script, 1 round"]]
    loads = harness.all_loads(runs.values())
    print(f"\nloads at each start: {min(loads):.2f} to {max(loads):.2f}; fit_run imported Lightning: {any(light)}")


if __name__ == "__main__":
    main()
