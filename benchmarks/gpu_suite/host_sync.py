"""3. Host synchronizations per round (CUDA) and ``aten._local_scalar_dense`` calls per round (every device)."""

from __future__ import annotations

import contextlib
import sys
import traceback
from pathlib import Path

import torch

from .common import Skipped, _cap, _f, _status, sync, trainer_for


def sync_cases(suite) -> dict:
    """The runs whose rounds are counted: name -> (module factory, data module factory)."""
    from lfed.lightning.datamodule import FederatedDataModule
    from lfed.lightning.module import FederatedModule
    from lfed.models.zoo import MLP

    def mlp():
        return MLP(in_features=64, hidden=[200, 200], num_classes=10)

    def dp():  # configs/dp_digits.yaml
        from lfed.privacy import DPFedAvg

        return FederatedModule(mlp(), algorithm="dp_fedavg", combination=DPFedAvg(noise_multiplier=0.8, clip=0.5),
                               fraction=0.2, training=dict(client_lr=0.1, batch_size=10, local_epochs=1))

    def lora():  # configs/lora_digits.yaml
        from lfed.models.adapters import LoRA

        net = LoRA(MLP(in_features=64, hidden=[64, 64], num_classes=10), rank=4, alpha=8, target=["net.0", "net.2"],
                   train=["net.4.*"], freeze_a=False)
        return FederatedModule(net, algorithm="fedavg", fraction=0.25, training=dict(client_lr=0.1, batch_size=10, local_epochs=1))

    return {
        "fedavg (quickstart)": (lambda: suite.quickstart("auto"), suite.digits),
        "scaffold": (lambda: suite.quickstart("auto", algorithm="scaffold"), suite.digits),
        "dp_fedavg (configs/dp_digits.yaml)": (
            dp, lambda: FederatedDataModule(dataset="digits", num_clients=100, partition="dirichlet", rho=0.5)),
        "ditto": (lambda: suite.quickstart("auto", algorithm="ditto"), suite.digits),
        "lora (configs/lora_digits.yaml)": (lora, suite.digits),
    }


def run(suite, h: dict) -> None:
    from lightning.pytorch import Callback, seed_everything
    from torch.utils._python_dispatch import TorchDispatchMode

    s, dev = suite.s, suite.device
    cuda = dev.type == "cuda"
    h["what"] = (f"rounds {s.sync_warmup + 1}-{s.sync_warmup + s.sync_rounds} of each run (round 1 warm-up), from "
                 "on_train_batch_start to on_train_batch_end: on CUDA the warnings of torch.cuda.set_sync_debug_mode('warn') "
                 "(issue 37's target: at most 1 a round); on every device the calls of aten._local_scalar_dense "
                 "(.item(), bool/float/int of a tensor) seen by a TorchDispatchMode (the CPU test's target: at most 2)")
    if not cuda:
        h["sync_warnings"] = "not applicable on cpu"
    local = torch.ops.aten._local_scalar_dense.default

    class Scalars(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is local:
                self.n += 1
            return func(*args, **(kwargs or {}))

    class Count(Callback):
        def __init__(self) -> None:
            self.syncs: list[int] = []
            self.scalars: list[int] = []
            self.sites: dict[str, int] = {}  # where each sync was called (innermost non-torch frames first)

        def on_train_batch_start(self, trainer, *a) -> None:
            self.live = trainer.global_step >= s.sync_warmup
            if not self.live:
                return
            sync(dev)
            self.stack = contextlib.ExitStack()
            if cuda:
                import warnings

                self.caught = []
                self.stack.enter_context(warnings.catch_warnings())
                warnings.simplefilter("always")
                warnings.showwarning = self.show  # called where the warning is raised: the stack is the sync's
                torch.cuda.set_sync_debug_mode("warn")
            self.mode = self.stack.enter_context(Scalars())

        def show(self, message, category, filename, lineno, file=None, line=None) -> None:
            import traceback as tb

            if "called a synchronizing CUDA operation" not in str(message):
                return
            self.caught.append(message)
            frames = [f for f in tb.extract_stack()[:-1] if "/torch/" not in f.filename and "warnings" not in f.filename]
            site = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-3:][::-1])
            self.sites[site] = self.sites.get(site, 0) + 1

        def on_train_batch_end(self, trainer, *a) -> None:
            if not self.live:
                return
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
            self.stack.close()
            self.scalars.append(self.mode.n)
            if cuda:
                self.syncs.append(len(self.caught))

    rows = h.setdefault("runs", [])
    for name, (make, data) in sync_cases(suite).items():
        row = {"run": name}
        try:
            if name.startswith("lora"):
                try:
                    import peft  # noqa: F401
                except Exception as err:  # noqa: BLE001
                    raise Skipped(f"peft not importable ({type(err).__name__}: {err})") from None
            seed_everything(0, verbose=False)
            count = Count()
            try:
                trainer_for(dev, s.sync_warmup + s.sync_rounds, "32-true", callbacks=[count]).fit(make(), datamodule=data())
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
            row["local_scalar_dense_per_round"] = count.scalars
            if cuda:
                row["sync_warnings_per_round"] = count.syncs
                row["at_most_one_per_round"] = bool(count.syncs) and max(count.syncs) <= 1
                row["sync_sites"] = count.sites
            else:
                row["sync_warnings_per_round"] = "not applicable on cpu"
            row["status"] = "ok"
        except Skipped as why:
            row.update(status="skipped", reason=str(why))
        except Exception:  # noqa: BLE001
            row.update(status="error", error=traceback.format_exc())
            print(row["error"], file=sys.stderr, flush=True)
        rows.append(row)
        print(f"  {name}: {row['status']} syncs {row.get('sync_warnings_per_round')} "
              f"_local_scalar_dense {row.get('local_scalar_dense_per_round')}", flush=True)
        suite.write()
    h["cases"] = [{"name": r["run"], "status": r["status"]} for r in rows]  # errors count in the exit status


def markdown(hs: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    if hs.get("runs"):
        L += ["## Host synchronizations per round", "", _cap(hs.get("what", "")), "",
              "| run | status | sync warnings per round (CUDA) | at most 1 | _local_scalar_dense per round |", "| --- | --- | --- | --- | --- |"]
        for r in hs["runs"]:
            L.append(f"| {r['run']} | {_status(r)} | {_f(r.get('sync_warnings_per_round'))} | {_f(r.get('at_most_one_per_round'))} | "
                     f"{_f(r.get('local_scalar_dense_per_round'))} |")
        L.append("")
        sites = [(r["run"], site, n) for r in hs["runs"] for site, n in (r.get("sync_sites") or {}).items()]
        if sites:
            L += ["Where the syncs were called (the innermost frames outside torch, innermost first; count over the measured rounds):",
                  "", "| run | site | syncs |", "| --- | --- | --- |"]
            L += [f"| {run} | `{site}` | {n} |" for run, site, n in sites]
            L.append("")
    return L
