"""Where a command's start-up goes: interpreter, imports, build, first round (issue 51 item 14).

    python benchmarks/startup_split.py --repeats 3

Three commands, each in fresh processes, interleaved, each started below a 1-minute load of 1.0 (up to
``$QUIET_WAIT`` s, ``benchmarks/quiet.py``), medians of ``--repeats``:

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

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
QUICK = ["--config", str(REPO / "configs" / "quickstart.yaml"), "--trainer.max_steps=1", "--trainer.logger=false",
         "--trainer.enable_progress_bar=false", "--checkpoint_every=0", "--trainer.val_check_interval=1"]


def child_cli(root: str) -> dict:
    t0 = time.perf_counter()
    from lightning.pytorch import Callback

    from lfed.lightning.cli import run_cli
    t1 = time.perf_counter()
    marks: dict[str, float] = {}

    class Marks(Callback):
        def on_train_start(self, *a):
            marks.setdefault("built", time.perf_counter())

        def on_train_batch_end(self, *a):
            marks.setdefault("round", time.perf_counter())

    import lfed.lightning.cli as cli_module

    original = cli_module.LfedCLI.instantiate_trainer

    def with_marks(self, **kwargs):
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), Marks()]
        return original(self, **kwargs)

    cli_module.LfedCLI.instantiate_trainer = with_marks
    run_cli(["fit", *QUICK, f"--trainer.default_root_dir={root}"])
    return {"imports": t1 - t0, "build": marks["built"] - t1, "first round": marks["round"] - marks["built"], "total": time.perf_counter() - t0}


def child_fit_run() -> dict:
    t0 = time.perf_counter()
    from lfed import FederatedDataset, LocalTraining, build_run, fit_run
    from lfed.models import MLP
    t1 = time.perf_counter()
    data = FederatedDataset(dataset="digits", num_clients=20, partition="dirichlet", rho=0.5)
    data.build()
    run = build_run(net=MLP(in_features=64, hidden=(200, 200), num_classes=10), algorithm="fedavg", fraction=0.25,
                    training=LocalTraining(client_lr=0.05, batch_size=10, local_epochs=1))
    t2 = time.perf_counter()
    fit_run(run, data, 1)
    t3 = time.perf_counter()
    return {"imports": t1 - t0, "build": t2 - t1, "first round": t3 - t2, "total": t3 - t0,
            "lightning imported": any(m == "lightning" or m.startswith("lightning.") for m in sys.modules)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", choices=["cli", "fit_run"])
    p.add_argument("--root", default="/tmp/startup_split")
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child_cli(args.root) if args.child == "cli" else child_fit_run()))
        return
    sys.path.insert(0, str(HERE))
    from quiet import wait_quiet

    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    cmds = {"lfed fit, quickstart, 1 round": [__file__, "--child", "cli"], "fit_run script, 1 round": [__file__, "--child", "fit_run"],
            "lfed fit --help": ["-m", "lfed", "fit", "--help"]}
    res: dict[str, list[dict]] = {c: [] for c in cmds}
    loads = []
    for rep in range(args.repeats):
        for name, cmd in (cmds.items() if rep % 2 == 0 else reversed(list(cmds.items()))):
            load, _ = wait_quiet()
            loads.append(load)
            t = time.perf_counter()
            done = subprocess.run([sys.executable, *cmd], cwd=REPO, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t
            if done.returncode:
                raise SystemExit(f"{name}: {done.stderr[-2000:]}")
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            row = {"wall": wall, **(json.loads(line[7:]) if line else {})}
            if "total" in row:
                row["interpreter"] = wall - row["total"]
            res[name].append(row)
    print("| command | interpreter | imports | build | first round | wall |")
    print("|---|---|---|---|---|---|")
    for name, rows in res.items():
        def med(key):
            vals = [r[key] for r in rows if key in r]
            return f"{statistics.median(vals):.2f} s" if vals else "–"
        print(f"| {name} | {med('interpreter')} | {med('imports')} | {med('build')} | {med('first round')} | {med('wall')} |")
    light = [r.get("lightning imported") for r in res["fit_run script, 1 round"]]
    print(f"\nloads at each start: {min(loads):.2f} to {max(loads):.2f}; fit_run imported Lightning: {any(light)}")


if __name__ == "__main__":
    main()
