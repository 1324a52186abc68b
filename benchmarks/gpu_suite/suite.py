"""The suite's plumbing: its result, sections, checks, budget and the cases every section times."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import traceback
from pathlib import Path

import harness
import torch

from . import compile_graphs, correctness, dp_sgd, environment, host_sync, lora, personal, precision, profiling, report, resnet, set_up, timing
from .common import PflCNN, Settings, Skipped, peak_memory, reset_peak, sync, trainer_for

#: The sections in the order they run: name (``--sections``) -> module (its ``run(suite, entry)``).
SECTIONS = {"environment": environment, "correctness": correctness, "setup": set_up, "host_sync": host_sync, "timing": timing,
            "profile": profiling, "compile_graphs": compile_graphs, "precision": precision, "lora": lora, "personal_eval": personal,
            "resnet": resnet, "dp_sgd": dp_sgd}


class Suite:
    """One run of the suite: ``result`` (rewritten to ``<out>/gpu_suite.json`` and ``.md`` after every section, check and
    case), the sizes ``s``, the device, the time budget; and what more than one section uses (the quickstart and the
    timing job's data and module, a timed case)."""

    def __init__(self, args) -> None:
        self.args = args
        self.s = Settings(args.quick)
        if getattr(args, "cohorts", None):
            self.s.cohorts = sorted(args.cohorts)
            self.s.pfl_cohorts = [k for k in self.s.pfl_cohorts if k in self.s.cohorts] or self.s.cohorts[:1]
        self.device = torch.device(args.device)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = harness.clock()
        self.result: dict = {"suite": "lfed gpu_suite (issue 28)", "args": vars(args), "quick": args.quick,
                             "device": str(self.device), "sections": {}}
        self.tmp = tempfile.TemporaryDirectory(prefix="lfed_gpu_suite_")

    def elapsed(self) -> float:
        return harness.clock() - self.t0

    def section(self, name: str, fn) -> None:
        entry = self.result["sections"].setdefault(name, {})
        print(f"[gpu_suite {self.elapsed():6.1f}s] section {name} ...", flush=True)
        with harness.stopwatch() as sw:
            try:
                fn(entry)
                entry["status"] = "ok"
            except Exception:  # noqa: BLE001 - recorded, the suite goes on
                entry["status"] = "error"
                entry["error"] = traceback.format_exc()
                print(entry["error"], file=sys.stderr, flush=True)
        entry["seconds"] = sw.seconds
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.write()

    def write(self) -> None:
        self.result["elapsed_s"] = self.elapsed()
        self.result["exit_status"] = self.exit_status()
        (self.out / "gpu_suite.json").write_text(json.dumps(self.result, indent=1, default=str))
        (self.out / "gpu_suite.md").write_text(report.markdown(self.result))

    def checks(self) -> list[dict]:
        return self.result["sections"].get("correctness", {}).get("checks", [])

    def exit_status(self) -> int:
        if any(not c["passed"] for c in self.checks()):
            return 1
        secs = self.result["sections"].values()
        if any(s.get("status") == "error" for s in secs):
            return 2
        for s in secs:
            if any(c.get("status") == "error" for c in s.get("cases", [])):
                return 2
        return 0

    def digits(self, **kw):
        from lfed.lightning.datamodule import FederatedDataModule

        return FederatedDataModule(dataset="digits", num_clients=20, partition="dirichlet", rho=0.5, **kw)

    def quickstart(self, backend="auto", dtype=torch.float32, algorithm="fedavg", net=None, *, training=None, engine=None, **model):
        """configs/quickstart.yaml through the Python API: digits, 20 clients, MLP 64-200-200-10, FedAvg (``training`` and
        ``engine`` are merged over its own)."""
        from lightning.pytorch import seed_everything

        from lfed.lightning.module import FederatedModule
        from lfed.models.zoo import MLP

        seed_everything(0, verbose=False)
        net = net() if net is not None else MLP(in_features=64, hidden=[200, 200], num_classes=10)
        kwargs = dict(fraction=0.25, training={"client_lr": 0.05, "batch_size": 10, "local_epochs": 1, **(training or {})})
        kwargs.update(model)
        return FederatedModule(net.to(dtype), algorithm=algorithm, engine={"backend": backend, **(engine or {})}, **kwargs)

    def check(self, c: dict, name: str, passed: bool, tolerance: str, max_diff: float, **extra) -> None:
        row = {"name": name, "passed": bool(passed), "tolerance": tolerance, "max_diff": max_diff, **extra}
        c.setdefault("checks", []).append(row)
        print(f"  {'PASS' if passed else 'FAIL'} {name}: max diff {max_diff:.3g} ({tolerance})", flush=True)
        self.write()

    def guarded(self, c: dict, name: str, tolerance: str, fn) -> None:
        """Run one check; an exception fails it (with the traceback)."""
        try:
            fn()
        except Exception:  # noqa: BLE001
            self.check(c, name, False, tolerance, math.inf, error=traceback.format_exc())

    def pfl_data(self):
        if getattr(self, "_pfl_data", None) is None:
            from lfed.lightning.datamodule import FederatedDataModule

            s = self.s
            g = torch.Generator().manual_seed(0)
            n = s.num_clients * s.images_per_client
            x = torch.rand(n, 3, s.image_size, s.image_size, generator=g)
            y = torch.randint(0, 10, (n,), generator=g)
            tx = torch.rand(s.test_images, 3, s.image_size, s.image_size, generator=g)
            ty = torch.randint(0, 10, (s.test_images,), generator=g)
            self._pfl_tensors = (x, y, tx, ty)
            self._pfl_data = lambda: FederatedDataModule.from_tensors(
                x, y, tx, ty, num_clients=s.num_clients, partition="iid", holdout_fraction=0.0, num_classes=10, seed=0)
        return self._pfl_data

    def pfl_module(self, backend: str, cohort: int, lr: float = 0.05, seed: int = 0):
        from lfed.lightning.module import FederatedModule

        torch.manual_seed(seed)
        net = PflCNN(image_size=self.s.image_size)
        return FederatedModule(net, algorithm="fedavg", fraction=cohort / self.s.num_clients,
                               training=dict(client_lr=lr, batch_size=self.s.batch_size, local_epochs=1), engine=dict(backend=backend),
                               seed=seed)

    def clock(self, warmup: int, cap_s: float):
        """A :func:`harness.step_clock` on this device: every round (``.seconds``) and evaluation (``.evals``), synchronized;
        the run stops once the rounds after ``warmup`` spent ``cap_s`` (at least 3 of them)."""
        return harness.step_clock(lambda: sync(self.device), cap_s=cap_s, skip=warmup)

    def lfed_case(self, backend: str, cohort: int, precision: str = "32-true", conv_form: str | None = None) -> dict:
        """``conv_form``: the vmap backend's form of the convolutions (lfed.engine.conv; None: lfed's rule, native on
        every device), set through ``LFED_CONV_FORM`` for this case only."""
        s = self.s
        clock = self.clock(s.warmup, self.args.case_cap_s)
        m = self.pfl_module(backend, cohort)
        reset_peak(self.device)
        start = harness.clock()
        before = os.environ.get("LFED_CONV_FORM")
        if conv_form is not None:
            os.environ["LFED_CONV_FORM"] = conv_form
        try:
            trainer_for(self.device, s.warmup + s.timed, precision, evaluate_every=s.evaluate_every,
                        callbacks=[clock]).fit(m, datamodule=self.pfl_data()())
        finally:
            if before is None:
                os.environ.pop("LFED_CONV_FORM", None)
            else:
                os.environ["LFED_CONV_FORM"] = before
        timed = clock.seconds[s.warmup:]
        return {"steady_s_per_round": statistics.median(timed), "timed_rounds": timed, "warmup_rounds": clock.seconds[:s.warmup],
                "eval_s": clock.evals, "wall_s": harness.clock() - start, "backend_used": getattr(m.runs[0].engine, "backend", backend),
                **peak_memory(self.device)}

    def budget_left(self, reserve: bool = True) -> float:
        """Seconds left of --budget-s; less the reserve for the sections after the timing one while ``reserve``."""
        return self.args.budget_s - (self.s.reserve_s if reserve else 0) - self.elapsed()

    def timed_case(self, t: dict, case: dict, fn, estimate_s: float | None, reserve: bool = True) -> dict:
        """Run one case into ``t["cases"]``: skipped (with the reason) when the budget is spent or its estimate
        would overrun it, or when it raises :class:`Skipped`; an error is recorded with its traceback. A case
        with ``examples_per_round`` gets ``tflops`` (the round's training FLOPs over its steady seconds)."""
        left = self.budget_left(reserve)
        if left <= 0 or (estimate_s is not None and estimate_s > left):
            case.update(status="skipped", reason=f"time budget: {max(left, 0):.0f} s left of --budget-s {self.args.budget_s:g}"
                        + (f" (less the {self.s.reserve_s} s reserve for the sections after timing)" if reserve else "")
                        + (f", estimate {estimate_s:.0f} s" if estimate_s is not None else ""))
        else:
            try:
                case.update(fn())
                case["status"] = "ok"
            except Skipped as why:
                case.update(status="skipped", reason=str(why))
            except Exception:  # noqa: BLE001
                case.update(status="error", error=traceback.format_exc())
                print(case["error"], file=sys.stderr, flush=True)
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
        flops = getattr(self, "flops_per_example", None)
        if case["status"] == "ok" and flops and case.get("examples_per_round") and case.get("steady_s_per_round"):
            case["tflops"] = flops * case["examples_per_round"] / case["steady_s_per_round"] / 1e12
        t.setdefault("cases", []).append(case)
        print(f"  {case['name']}: {case['status']} {case.get('steady_s_per_round', case.get('reason', ''))}", flush=True)
        self.write()
        return case

    def run(self) -> int:
        wanted = getattr(self.args, "sections", None)
        for name, module in SECTIONS.items():
            if name == "environment" or not wanted or name in wanted:
                self.section(name, lambda entry, module=module: module.run(self, entry))
        self.write()
        self.tmp.cleanup()
        status = self.exit_status()
        print(report.markdown(self.result))
        print(f"[gpu_suite] done in {self.elapsed():.1f} s, exit status {status}; {self.out / 'gpu_suite.json'}", flush=True)
        return status
