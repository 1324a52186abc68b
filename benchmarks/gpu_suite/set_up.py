"""2. Set-up in its parts: a fresh ``python -c`` child (cold imports) times each part of a script's set-up."""

from __future__ import annotations

import json
import os
import statistics
import sys

import harness

from .common import BENCH, REPO, _cap, _f, _status

SETUP_CHILD = r"""
import time
T0 = time.perf_counter()
import json, statistics, sys
cfg = json.loads(sys.argv[1])
sys.path[:0] = [cfg["repo"], cfg["bench"]]
out = {}
def mark(name, since):
    now = time.perf_counter()
    out[name] = now - since
    return now
import torch
t = mark("import_torch_s", T0)
import lightning.pytorch
t = mark("import_lightning_s", t)
import lfed
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
t = mark("import_lfed_s", t)
from gpu_suite import PflCNN, trainer_for
dev = torch.device(cfg["device"])
sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
torch.zeros(1, device=dev); sync()
t = mark("device_init_s", t)
g = torch.Generator().manual_seed(0)
N, n, S = cfg["clients"], cfg["images"], cfg["image_size"]
x, y = torch.rand(N * n, 3, S, S, generator=g), torch.randint(0, 10, (N * n,), generator=g)
tx, ty = torch.rand(cfg["test"], 3, S, S, generator=g), torch.randint(0, 10, (cfg["test"],), generator=g)
t = mark("synthetic_data_s", t)
dm = FederatedDataModule.from_tensors(x, y, tx, ty, num_clients=N, partition="iid", holdout_fraction=0.0, num_classes=10, seed=0)
torch.manual_seed(0)
m = FederatedModule(PflCNN(image_size=S), algorithm="fedavg", fraction=cfg["cohort"] / N,
                    training=dict(client_lr=0.05, batch_size=10, local_epochs=1), engine=dict(backend="vmap"), seed=0)
marks = {"start": [], "end": []}
from lightning.pytorch import Callback
class Marks(Callback):
    def on_train_batch_start(self, *a):
        sync(); marks["start"].append(time.perf_counter())
    def on_train_batch_end(self, *a):
        sync(); marks["end"].append(time.perf_counter())
trainer = trainer_for(dev, cfg["rounds"], "32-true", callbacks=[Marks()])
t = mark("build_s", t)
trainer.fit(m, datamodule=dm)
out["fit_to_first_round_s"] = marks["start"][0] - t
rounds = [b - a for a, b in zip(marks["start"], marks["end"])]
out["first_round_s"] = rounds[0]
out["steady_round_s"] = statistics.median(rounds[1:])
out["rounds"] = rounds
out["to_first_round_s"] = marks["start"][0] - T0
print(json.dumps(out))
"""


def run(suite, e: dict) -> None:
    import subprocess

    s = suite.s
    cfg = {"repo": str(REPO), "bench": str(BENCH), "device": str(suite.device),
           "clients": s.num_clients, "images": s.images_per_client, "image_size": s.image_size, "test": s.test_images,
           "cohort": s.setup_cohort, "rounds": s.setup_rounds}
    e["job"] = (f"the timing section's job at cohort {s.setup_cohort}, lfed vmap, {s.setup_rounds} rounds, no evaluation, "
                "in a fresh `python -c` process (cold imports), each part timed with time.perf_counter")
    e["lfed_own_parts"] = "build_s + fit_to_first_round_s + first_round_s (imports, device init and synthetic data excluded)"
    children = e.setdefault("children", [])
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONWARNINGS": "ignore"}
    for i in range(s.setup_children):
        if i and suite.budget_left() < 60:
            children.append({"status": "skipped", "reason": "time budget"})
            break
        done = subprocess.run([sys.executable, "-c", SETUP_CHILD, json.dumps(cfg)], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=max(60.0, min(300.0, suite.budget_left(False))))
        if done.returncode:
            raise RuntimeError(f"set-up child exited {done.returncode}:\n{done.stderr[-3000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["lfed_own_s"] = row["build_s"] + row["fit_to_first_round_s"] + row["first_round_s"]
        row["lfed_own_under_1s"] = row["lfed_own_s"] < 1.0
        row["load_after"] = harness.loadavg()
        children.append(row)
        suite.write()
    ok = [c for c in children if "lfed_own_s" in c]
    keys = ("import_torch_s", "import_lightning_s", "import_lfed_s", "device_init_s", "synthetic_data_s", "build_s",
            "fit_to_first_round_s", "first_round_s", "steady_round_s", "to_first_round_s", "lfed_own_s")
    e["median"] = {k: statistics.median(c[k] for c in ok) for k in keys}
    e["lfed_own_under_1s"] = e["median"]["lfed_own_s"] < 1.0


def markdown(su: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    if su.get("children"):
        L += ["## Set-up in its parts (fresh process, cold imports)", "", _cap(su.get("job", "")), "",
              f"lfed's own part = {su.get('lfed_own_parts')}; under 1 s (median): **{_f(su.get('lfed_own_under_1s'))}**.", "",
              "| child | import torch | import lightning.pytorch | import lfed | device init | synthetic data | build | "
              "fit to round 1 | round 1 | steady round | lfed's own | start to round 1 |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for i, c in enumerate(su["children"]):
            if "lfed_own_s" not in c:
                L.append(f"| {i} | {_status(c)} |" + " - |" * 11)
                continue
            L.append(f"| {i} | " + " | ".join(_f(c[k], 3) for k in (
                "import_torch_s", "import_lightning_s", "import_lfed_s", "device_init_s", "synthetic_data_s", "build_s",
                "fit_to_first_round_s", "first_round_s", "steady_round_s", "lfed_own_s", "to_first_round_s")) + " |")
        L.append("")
    return L
