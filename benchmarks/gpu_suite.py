"""One command that checks and times lfed on a device (issue 28): correctness, timings, profile.

    python benchmarks/gpu_suite.py --device cpu --quick --out /tmp/gpu_suite      # CI (tests/test_gpu_suite.py)
    python3 benchmarks/gpu_suite.py --device cuda --out $OUT/gpu_suite           # on a GPU, ~6-8 min

Writes ``<out>/gpu_suite.json`` (everything, rewritten after every section and timing case, so a
run killed at its time limit still leaves what it measured) and ``<out>/gpu_suite.md`` (tables).
One process; the sections are independent: an error in one is recorded (with its traceback) and
the suite goes on. Exit status: 0 all passed, 1 a correctness check failed, 2 a section or a
timing case raised (and no check failed).

0. environment: Python, torch, CUDA, cuDNN, device name and capability, TF32 flags, threads, and
   whether lightning / jsonargparse / wandb / torchvision / sklearn import. lfed is imported from
   this checkout (``sys.path``), driven through its Python API only (no ``lfed fit`` CLI, no
   jsonargparse, no wandb: the GPU machine has neither).
1. correctness on the device, each check with an explicit tolerance and the max difference seen:
   vmap vs loop backends in float64 (the quickstart's FedAvg MLP on digits; SmallCNN with SCAFFOLD,
   IGFL time attention, EFL with compression and stragglers); the quickstart on the device against
   the same run on the CPU in float32; a run stopped at round 3 and resumed to 6 against one of 6
   rounds, bit for bit on the device; ``client_state="host"`` (pinned memory on CUDA) against
   ``"device"``, bit for bit.
2. timing of pfl-research's CIFAR-10 benchmark job on SYNTHETIC CIFAR-shaped data (random images
   and labels, not CIFAR-10): 1,000 clients of 50 images, FedAvg, 1 local epoch of batch 10 (5
   local steps), pfl's 2-conv + 128-dense CNN (:class:`PflCNN`, 1,626,442 parameters at 32x32),
   evaluation every 10 rounds: steady seconds per round (median of the timed rounds, warm-up
   excluded, synchronized on CUDA) of lfed vmap, lfed loop and a plain PyTorch per-client loop at
   cohorts 50, 200 and 1,000, with peak device memory (``max_memory_allocated``, reset per case; on
   the CPU the peak RSS, reset per case through /proc/self/clear_refs where Linux allows it); and
   a grid of 18 runs (6 client lrs x 3 seeds, cohort 50) as one group against the 18 runs one
   after another.
3. a ``torch.profiler`` summary of one lfed vmap round (kernel time against launch and Python
   overhead per local step, top ops), and the vmapped local step eager / recorded (lfed's
   ``make_fx`` replay) / ``torch.compile``-d / replayed as a CUDA graph: each variant's time and
   its difference from the eager step; ``keep`` = exact (bit for bit) and faster than lfed's
   recorded step. Nothing in lfed is changed by this: it is the evidence for such a change.

``--quick`` shrinks everything (a few clients, 12x12 images, a grid of 3 runs, the compile
backend ``aot_eager``) so the suite runs on one CPU thread in well under a minute.
``--budget-s`` (default 480 s, the full run's estimate being ~6-8 min on an H100) bounds the
whole run: a timing case that would start past ``budget - reserve`` (the reserve is kept for
section 3), or whose estimate (its method's last s/round scaled by the cohort) would overrun it,
is recorded as skipped with the reason; a case also stops timing once it has spent ``--case-cap-s``
with at least 3 timed rounds.

On the device tool's GPU machine (see /work/.library/device/README.md): it has no package index
and another torch (2.11 in Nov. 2026), with lightning, sklearn and torchvision but no wandb or
jsonargparse, none of which this suite needs; the tool sends the session's own checkout (not a
helper's worktree), so the suite must be committed there first. Nothing needs carrying. One
command, well inside the 10-minute limit of a call:

    mkdir -p $OUT/gpu_suite && PYTHONUNBUFFERED=1 WANDB_MODE=disabled python3 benchmarks/gpu_suite.py \\
        --device cuda --out $OUT/gpu_suite --budget-s 480 2>&1 | tee $OUT/gpu_suite/log.txt

(timeout_s=600; gpu_suite.json, gpu_suite.md and log.txt come back, one folder down.)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # lfed from this checkout (the GPU machine has no lfed installed)
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

#: pfl-research's published A100 time for this job: not documented anywhere in this repository.
PFL_A100_NOTE = ("pfl-research's published A100 time for this job: PLACEHOLDER, not documented in this repository "
                 "(look it up in pfl-research's paper/benchmarks before comparing; no number is invented here)")


# ----------------------------------------------------------------------------- the model


class PflCNN(nn.Module):
    """pfl-research's CIFAR-10 benchmark CNN (``benchmarks/model/pytorch/cnn.py``, ``simple_cnn``), re-written.

    conv 3x3 32 (no padding) + ReLU -> conv 3x3 64 + ReLU -> max-pool 2 -> dropout 0.25 -> dense 128 +
    ReLU -> dropout 0.5 -> dense ``num_classes``; Glorot-uniform weights as pfl's. Parameters at
    32x32 RGB, 10 classes: ``896 + 18,496 + 12,544*128+128 = 1,605,760 + 1,290`` = **1,626,442**.
    lfed.models has no such model (McMahanCIFARCNN is the TF tutorial's 5x5 network).
    """

    def __init__(self, num_classes: int = 10, image_size: int = 32, dropout: bool = True) -> None:
        super().__init__()
        self.image_size = image_size
        side = (image_size - 4) // 2
        self.conv1 = nn.Conv2d(3, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(side * side * 64, 128)
        self.fc2 = nn.Linear(128, num_classes)
        self.drop1 = nn.Dropout(0.25) if dropout else nn.Identity()
        self.drop2 = nn.Dropout(0.5) if dropout else nn.Identity()
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)

    def forward(self, x):
        x = x.view(-1, 3, self.image_size, self.image_size)
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(self.drop1(x).flatten(1)))
        return self.fc2(self.drop2(x))


# ----------------------------------------------------------------------------- settings


class Settings:
    """Every size of the suite, full (GPU) or quick (CPU CI)."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.correct_rounds = 3 if quick else 6        # vmap vs loop, host vs device
        self.device_cpu_rounds = 3 if quick else 10    # quickstart on the device vs the CPU
        self.algorithms = ["scaffold", "igfl_s_time", "efl"]
        self.resume_cases = ["efl"] if quick else ["efl", "igfl_s_time", "fedavg"]
        # the pfl job
        self.num_clients = 16 if quick else 1000
        self.images_per_client = 20 if quick else 50
        self.test_images = 40 if quick else 10_000
        self.image_size = 12 if quick else 32
        self.batch_size = 10
        self.cohorts = [2, 4] if quick else [50, 200, 1000]
        self.evaluate_every = 10
        self.warmup = 1 if quick else 2
        self.timed = 2 if quick else 8
        self.grid_lrs = [0.05] if quick else [0.003, 0.01, 0.02, 0.05, 0.1, 0.2]
        self.grid_seeds = [0, 1, 2]
        self.grid_cohort = 2 if quick else 50
        self.grid_timed = 2 if quick else 4
        self.profile_cohort = 2 if quick else 50
        self.compile_backend = "aot_eager" if quick else "inductor"
        self.step_reps = 3 if quick else 20
        self.reserve_s = 0 if quick else 150   # kept for section 3 in the timing section's budget


# ----------------------------------------------------------------------------- helpers


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    else:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (peak RSS) on Linux


def peak_memory(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"peak_device_mib": torch.cuda.max_memory_allocated(device) / 2**20}
    hwm = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    if hwm is None:
        return {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_reset": False}
    return {"peak_rss_mib": hwm, "rss_reset": True}


def trainer_for(device: torch.device, rounds: int, precision: str, evaluate_every: int | None = None, callbacks=(),
                root: str | None = None):
    from lightning.pytorch import Trainer

    return Trainer(
        max_steps=rounds, accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        precision=precision, check_val_every_n_epoch=None, val_check_interval=evaluate_every or rounds,
        limit_val_batches=None if evaluate_every else 0, callbacks=list(callbacks), default_root_dir=root,
    )


def flat(module) -> torch.Tensor:
    return module.layout.module_vector(module.net).detach().cpu()


def diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max |a - b|, max |a - b| / max |b|) in float64."""
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    if a.shape != b.shape:
        return math.inf, math.inf
    m = float((a - b).abs().max()) if a.numel() else 0.0
    return m, m / max(float(b.abs().max()) if b.numel() else 0.0, 1e-300)


def state_diff(a: dict, b: dict) -> tuple[bool, float, list[str]]:
    """Whether two state dicts are equal bit for bit; their max abs difference; the keys that differ."""
    bad, worst = [], 0.0
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            bad.append(f"{key} (missing)")
            continue
        x, y = a[key], b[key]
        if not isinstance(x, torch.Tensor):
            if x != y:
                bad.append(key)
            continue
        x, y = x.detach().cpu(), y.detach().cpu()
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            bad.append(key)
            if x.shape == y.shape and x.is_floating_point():
                worst = max(worst, float((x.double() - y.double()).abs().max()) if x.numel() else 0.0)
            else:
                worst = math.inf
    return not bad, worst, bad


class Suite:
    def __init__(self, args) -> None:
        self.args = args
        self.s = Settings(args.quick)
        self.device = torch.device(args.device)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.perf_counter()
        self.result: dict = {"suite": "lfed gpu_suite (issue 28)", "args": vars(args), "quick": args.quick,
                             "device": str(self.device), "sections": {}}
        self.tmp = tempfile.TemporaryDirectory(prefix="lfed_gpu_suite_")

    # ------------------------------------------------------------------ plumbing
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def section(self, name: str, fn) -> None:
        start = time.perf_counter()
        entry = self.result["sections"].setdefault(name, {})
        print(f"[gpu_suite {self.elapsed():6.1f}s] section {name} ...", flush=True)
        try:
            fn(entry)
            entry["status"] = "ok"
        except Exception:  # noqa: BLE001 - recorded, the suite goes on
            entry["status"] = "error"
            entry["error"] = traceback.format_exc()
            print(entry["error"], file=sys.stderr, flush=True)
        entry["seconds"] = time.perf_counter() - start
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.write()

    def write(self) -> None:
        self.result["elapsed_s"] = self.elapsed()
        self.result["exit_status"] = self.exit_status()
        (self.out / "gpu_suite.json").write_text(json.dumps(self.result, indent=1, default=str))
        (self.out / "gpu_suite.md").write_text(markdown(self.result))

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

    # ------------------------------------------------------------------ 0. environment
    def environment(self, e: dict) -> None:
        e["python"] = sys.version.split()[0]
        e["platform"] = platform.platform()
        e["torch"] = torch.__version__
        e["torch_cuda"] = torch.version.cuda
        e["cuda_available"] = torch.cuda.is_available()
        e["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        e["threads"] = torch.get_num_threads()
        e["cpu_count"] = os.cpu_count()
        e["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        e["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
        e["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        if self.device.type == "cuda":
            p = torch.cuda.get_device_properties(self.device)
            e["device_name"] = p.name
            e["capability"] = f"{p.major}.{p.minor}"
            e["device_memory_gib"] = p.total_memory / 2**30
            e["multiprocessors"] = p.multi_processor_count
        else:
            e["device_name"] = platform.processor() or platform.machine()
        imports = {}
        for name in ("lightning", "jsonargparse", "wandb", "torchvision", "sklearn", "numpy", "lfed"):
            try:
                mod = importlib.import_module(name)
                imports[name] = getattr(mod, "__version__", "imported")
            except Exception as err:  # noqa: BLE001
                imports[name] = f"not importable: {type(err).__name__}: {err}"
        e["imports"] = imports
        import lfed

        e["lfed_file"] = lfed.__file__
        with contextlib.suppress(Exception):
            import subprocess

            e["git_commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                                             timeout=10).stdout.strip() or None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda but torch.cuda.is_available() is False")

    # ------------------------------------------------------------------ 1. correctness
    def digits(self, **kw):
        from lfed.data.datamodule import FederatedDataModule

        return FederatedDataModule(dataset="digits", num_clients=20, partition="dirichlet", rho=0.5, **kw)

    def quickstart(self, backend="auto", dtype=torch.float32, algorithm="fedavg", net=None, **model):
        """configs/quickstart.yaml through the Python API: digits, 20 clients, MLP 64-200-200-10, FedAvg."""
        from lightning.pytorch import seed_everything

        from lfed.models import MLP
        from lfed.module import FederatedModule

        seed_everything(0, verbose=False)
        net = net() if net is not None else MLP(in_features=64, hidden=[200, 200], num_classes=10)
        kwargs = dict(fraction=0.25, client_lr=0.05, batch_size=10, local_epochs=1)
        kwargs.update(model)
        return FederatedModule(net.to(dtype), algorithm=algorithm, backend=backend, **kwargs)

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

    def correctness(self, c: dict) -> None:
        s, dev = self.s, self.device
        f64 = "64-true"
        tol = 1e-10

        def vmap_loop(name, make, algorithm, rounds, **model):
            w = {}
            for backend in ("vmap", "loop"):
                m = self.quickstart(backend, torch.float64, algorithm, net=make, **model)
                trainer_for(dev, rounds, f64).fit(m, datamodule=self.digits())
                w[backend] = flat(m)
            d, rel = diff(w["vmap"], w["loop"])
            self.check(c, f"vmap vs loop, float64: {name}", rel <= tol, f"max|Δ| / max|w| <= {tol:g}", d, relative=rel,
                       rounds=rounds, params=w["vmap"].numel())

        from lfed.models import SmallCNN

        self.guarded(c, "vmap vs loop, float64: quickstart MLP (FedAvg)", f"relative <= {tol:g}",
                     lambda: vmap_loop("quickstart MLP (FedAvg)", None, "fedavg", s.correct_rounds))
        cnn_cases = {
            "scaffold": {},
            "igfl_s_time": {},
            "efl": dict(compression=0.3, p_inactive=0.1, p_incomplete=0.4, fisher_samples=8),
        }
        for algorithm in s.algorithms:
            label = f"SmallCNN {algorithm}" + (" (compression 0.3, stragglers)" if algorithm == "efl" else "")
            self.guarded(c, f"vmap vs loop, float64: {label}", f"relative <= {tol:g}",
                         lambda a=algorithm, lab=label: vmap_loop(lab, SmallCNN, a, s.correct_rounds, **cnn_cases[a]))

        def device_vs_cpu():
            w = {}
            for where in ("cpu", str(dev)):
                m = self.quickstart("auto", torch.float32)
                trainer_for(torch.device(where), s.device_cpu_rounds, "32-true").fit(m, datamodule=self.digits())
                w[where] = flat(m)
            d, rel = diff(w[str(dev)], w["cpu"])
            tol32 = 1e-4
            self.check(c, f"quickstart float32: {dev} vs cpu", rel <= tol32, f"max|Δ| / max|w| <= {tol32:g} (float32 round-off)",
                       d, relative=rel, rounds=s.device_cpu_rounds, bit_identical=bool(d == 0.0))

        self.guarded(c, f"quickstart float32: {dev} vs cpu", "relative <= 1e-4", device_vs_cpu)

        resume_model = {
            "efl": dict(compression=0.3, p_inactive=0.1, p_incomplete=0.4, fisher_samples=8),
            "igfl_s_time": dict(p_inactive=0.2),
            "fedavg": {},
        }

        def resume(algorithm):
            root = Path(self.tmp.name) / f"resume_{algorithm}"
            whole = self.quickstart("auto", torch.float32, algorithm, **resume_model[algorithm])
            trainer_for(dev, 6, "32-true", evaluate_every=3, root=str(root)).fit(whole, datamodule=self.digits())
            # the same uninterrupted run again: tells a resume bug from a non-deterministic device kernel
            repeat = self.quickstart("auto", torch.float32, algorithm, **resume_model[algorithm])
            trainer_for(dev, 6, "32-true", evaluate_every=3, root=str(root)).fit(repeat, datamodule=self.digits())
            repeat_same = state_diff(repeat.state_dict(), whole.state_dict())[0]
            first = self.quickstart("auto", torch.float32, algorithm, **resume_model[algorithm])
            t = trainer_for(dev, 3, "32-true", evaluate_every=3, root=str(root))
            t.fit(first, datamodule=self.digits())
            ckpt = root / "round3.ckpt"
            t.save_checkpoint(ckpt)
            again = self.quickstart("auto", torch.float32, algorithm, **resume_model[algorithm])
            trainer_for(dev, 6, "32-true", evaluate_every=3, root=str(root)).fit(again, datamodule=self.digits(), ckpt_path=str(ckpt))
            same, worst, bad = state_diff(again.state_dict(), whole.state_dict())
            d, _ = diff(flat(again), flat(whole))
            evals_same = [a for a in again.eval_history] == [b for b in whole.eval_history]
            self.check(c, f"stop at 3, resume to 6 on {dev}: {algorithm}", same and d == 0.0 and evals_same,
                       "bit for bit (state dict, weights, evaluation history)", max(d, worst), differing_keys=bad[:10],
                       eval_history_same=evals_same, uninterrupted_run_repeats_bit_for_bit=repeat_same,
                       rounds_done=again.runs[0].rounds_done)

        for algorithm in s.resume_cases:
            self.guarded(c, f"stop at 3, resume to 6 on {dev}: {algorithm}", "bit for bit", lambda a=algorithm: resume(a))

        def host_vs_device():
            runs = {}
            for placement in ("device", "host"):
                m = self.quickstart("auto", torch.float32, "scaffold", client_state=placement, p_incomplete=0.3)
                trainer_for(dev, s.correct_rounds, "32-true").fit(m, datamodule=self.digits())
                runs[placement] = m
            same, worst, bad = state_diff(runs["host"].state_dict(), runs["device"].state_dict())
            d, _ = diff(flat(runs["host"]), flat(runs["device"]))
            pinned = [getattr(r, "pinned", None) for r in runs["host"].store._rows.values()]
            ok = same and d == 0.0 and (dev.type != "cuda" or all(pinned))
            self.check(c, f"client_state host vs device on {dev}: scaffold", ok,
                       "bit for bit" + (" and host rows pinned" if dev.type == "cuda" else ""), max(d, worst),
                       differing_keys=bad[:10], host_rows_pinned=pinned)

        self.guarded(c, f"client_state host vs device on {dev}: scaffold", "bit for bit", host_vs_device)

    # ------------------------------------------------------------------ 2. timing: the pfl CIFAR-10 job
    def pfl_data(self):
        if getattr(self, "_pfl_data", None) is None:
            from lfed.data.datamodule import FederatedDataModule

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
        from lfed.module import FederatedModule

        torch.manual_seed(seed)
        net = PflCNN(image_size=self.s.image_size)
        return FederatedModule(net, algorithm="fedavg", fraction=cohort / self.s.num_clients, client_lr=lr,
                               batch_size=self.s.batch_size, local_epochs=1, backend=backend, seed=seed)

    def clock(self, warmup: int, cap_s: float):
        from lightning.pytorch import Callback

        dev = self.device

        class Clock(Callback):
            def __init__(self) -> None:
                self.rounds: list[float] = []
                self.evals: list[float] = []

            def on_train_batch_start(self, *a) -> None:
                sync(dev)
                self.t = time.perf_counter()

            def on_train_batch_end(self, trainer, *a) -> None:
                sync(dev)
                self.rounds.append(time.perf_counter() - self.t)
                timed = self.rounds[warmup:]
                if len(timed) >= 3 and sum(timed) > cap_s:
                    trainer.should_stop = True

            def on_validation_start(self, *a) -> None:
                sync(dev)
                self.v = time.perf_counter()

            def on_validation_end(self, *a) -> None:
                sync(dev)
                self.evals.append(time.perf_counter() - self.v)

        return Clock()

    def lfed_case(self, backend: str, cohort: int) -> dict:
        s = self.s
        clock = self.clock(s.warmup, self.args.case_cap_s)
        m = self.pfl_module(backend, cohort)
        reset_peak(self.device)
        start = time.perf_counter()
        trainer_for(self.device, s.warmup + s.timed, "32-true", evaluate_every=s.evaluate_every,
                    callbacks=[clock]).fit(m, datamodule=self.pfl_data()())
        timed = clock.rounds[s.warmup:]
        return {"steady_s_per_round": statistics.median(timed), "timed_rounds": timed, "warmup_rounds": clock.rounds[:s.warmup],
                "eval_s": clock.evals, "wall_s": time.perf_counter() - start, "backend_used": getattr(m.runs[0].engine, "backend", backend),
                **peak_memory(self.device)}

    def plain_case(self, cohort: int) -> dict:
        """The least a per-client Python loop costs: one model, torch.optim.SGD per client, weighted mean."""
        s, dev = self.s, self.device
        self.pfl_data()
        x, y = self._pfl_tensors[0].to(dev), self._pfl_tensors[1].to(dev)
        n = s.images_per_client
        torch.manual_seed(0)
        model = PflCNN(image_size=s.image_size).to(dev)
        glob = [p.detach().clone() for p in model.parameters()]
        g = torch.Generator().manual_seed(0)
        reset_peak(dev)
        rounds: list[float] = []
        start = time.perf_counter()
        for _ in range(s.warmup + s.timed):
            sync(dev)
            t = time.perf_counter()
            acc = [torch.zeros_like(w) for w in glob]
            for k in torch.randperm(s.num_clients, generator=g)[:cohort].tolist():
                with torch.no_grad():
                    for p, w in zip(model.parameters(), glob):
                        p.copy_(w)
                opt = torch.optim.SGD(model.parameters(), lr=0.05)
                model.train()
                perm = (torch.randperm(n, generator=g) + k * n).to(dev)
                for b in range(0, n, s.batch_size):
                    idx = perm[b:b + s.batch_size]
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x[idx]), y[idx]).backward()
                    opt.step()
                with torch.no_grad():
                    for a, p in zip(acc, model.parameters()):
                        a.add_(p, alpha=n)
            glob = [a / (n * cohort) for a in acc]
            sync(dev)
            rounds.append(time.perf_counter() - t)
            timed = rounds[s.warmup:]
            if len(timed) >= 3 and sum(timed) > self.args.case_cap_s:
                break
        timed = rounds[s.warmup:]
        return {"steady_s_per_round": statistics.median(timed), "timed_rounds": timed, "warmup_rounds": rounds[:s.warmup],
                "wall_s": time.perf_counter() - start, "note": "no evaluation", **peak_memory(dev)}

    def budget_left(self) -> float:
        return self.args.budget_s - self.s.reserve_s - self.elapsed()

    def timed_case(self, t: dict, case: dict, fn, estimate_s: float | None) -> dict:
        left = self.budget_left()
        if left <= 0 or (estimate_s is not None and estimate_s > left):
            case.update(status="skipped", reason=f"time budget: {max(left, 0):.0f} s left of --budget-s {self.args.budget_s:g} "
                        f"(less the {self.s.reserve_s} s reserve for section 3)"
                        + (f", estimate {estimate_s:.0f} s" if estimate_s is not None else ""))
        else:
            try:
                case.update(fn())
                case["status"] = "ok"
            except Exception:  # noqa: BLE001
                case.update(status="error", error=traceback.format_exc())
                print(case["error"], file=sys.stderr, flush=True)
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
        t.setdefault("cases", []).append(case)
        print(f"  {case['name']}: {case['status']} {case.get('steady_s_per_round', '')}", flush=True)
        self.write()
        return case

    def timing(self, t: dict) -> None:
        s = self.s
        t["job"] = (f"pfl-research CIFAR-10 benchmark job on SYNTHETIC CIFAR-shaped data (random images, random labels): "
                    f"{s.num_clients} clients x {s.images_per_client} images of 3x{s.image_size}x{s.image_size}, FedAvg, "
                    f"1 local epoch, batch {s.batch_size}, client lr 0.05, pfl's CNN, evaluation every {s.evaluate_every} rounds "
                    f"(on {s.test_images} test images)")
        t["params"] = sum(p.numel() for p in PflCNN(image_size=s.image_size).parameters())
        t["pfl_a100"] = PFL_A100_NOTE
        t["warmup_rounds"], t["max_timed_rounds"], t["case_cap_s"] = s.warmup, s.timed, self.args.case_cap_s
        last: dict[str, tuple[int, float]] = {}
        methods = {"lfed vmap": lambda k: self.lfed_case("vmap", k), "lfed loop": lambda k: self.lfed_case("loop", k),
                   "plain loop": self.plain_case}
        # cheap and telling first: vmap at every cohort, then the loops, the grid, the loops at the largest cohort last
        order = [("lfed vmap", k) for k in s.cohorts]
        order += [(m, k) for k in s.cohorts[:-1] for m in ("lfed loop", "plain loop")]
        tail = [(m, s.cohorts[-1]) for m in ("lfed loop", "plain loop")]
        for method, k in order:
            self._time_method(t, methods, last, method, k)
        self.section_grid(t)
        for method, k in tail:
            self._time_method(t, methods, last, method, k)
        by = {(c["method"], c["cohort"]): c for c in t["cases"] if "cohort" in c}
        for (_, k), c in by.items():
            plain = by.get(("plain loop", k))
            if c.get("status") == "ok" and plain and plain.get("status") == "ok":
                c["vs_plain_loop"] = c["steady_s_per_round"] / plain["steady_s_per_round"]

    def _time_method(self, t, methods, last, method, k) -> None:
        s = self.s
        est = None
        if method in last:
            k0, sec = last[method]
            est = sec * (k / k0) * (s.warmup + 3) * 1.5 + 5
        case = self.timed_case(t, {"name": f"{method}, cohort {k}", "method": method, "cohort": k},
                               lambda: methods[method](k), est)
        if case["status"] == "ok":
            last[method] = (k, case["steady_s_per_round"])

    def section_grid(self, t: dict) -> None:
        from lfed.group import GroupMember, RunGroup

        s = self.s
        points = [(lr, seed) for lr in s.grid_lrs for seed in s.grid_seeds]
        k = s.grid_cohort

        def group():
            dm = self.pfl_data()()
            members = [GroupMember(f"lr{lr:g}-s{seed}", self.pfl_module("vmap", k, lr, seed), dm, {"client_lr": lr, "seed": seed})
                       for lr, seed in points]
            g = RunGroup(members)
            clock = self.clock(s.warmup, self.args.case_cap_s)
            reset_peak(self.device)
            start = time.perf_counter()
            trainer_for(self.device, s.warmup + s.grid_timed, "32-true", evaluate_every=s.evaluate_every,
                        callbacks=[clock]).fit(g, datamodule=g.datamodule)
            timed = clock.rounds[s.warmup:]
            return {"steady_s_per_round": statistics.median(timed), "timed_rounds": timed, "wall_s": time.perf_counter() - start,
                    "engine_calls": g.engine_calls, **peak_memory(self.device)}

        def sequential():
            per_run, peaks, timed, start = [], [], [], time.perf_counter()
            for lr, seed in points:
                if self.budget_left() <= 0:
                    raise TimeoutError(f"time budget ran out after {len(per_run)} of {len(points)} runs")
                clock = self.clock(s.warmup, self.args.case_cap_s)
                m = self.pfl_module("vmap", k, lr, seed)
                reset_peak(self.device)
                trainer_for(self.device, s.warmup + s.grid_timed, "32-true", evaluate_every=s.evaluate_every,
                            callbacks=[clock]).fit(m, datamodule=self.pfl_data()())
                per_run.append(statistics.median(clock.rounds[s.warmup:]))
                timed += clock.rounds[s.warmup:]
                peaks.append(peak_memory(self.device))
            key = next(iter(peaks[0]))
            return {"steady_s_per_round": sum(per_run), "per_run_steady_s": per_run, "timed_rounds": timed, "wall_s": time.perf_counter() - start,
                    "note": "sum over the runs of each run's steady s/round", **peaks[0], key: max(p[key] for p in peaks)}

        n = len(points)
        vm = [c for c in t.get("cases", []) if c.get("method") == "lfed vmap" and c.get("status") == "ok"]
        est = None
        if vm:
            est = vm[0]["steady_s_per_round"] * n * (s.warmup + s.grid_timed) * 2 + 5 * n
        a = self.timed_case(t, {"name": f"grid of {n} runs as one group, cohort {k}", "grid": "group", "runs": n}, group, None)
        b = self.timed_case(t, {"name": f"grid of {n} runs one after another, cohort {k}", "grid": "sequential", "runs": n},
                            sequential, est)
        if a["status"] == "ok" and b["status"] == "ok":
            a["vs_one_after_another"] = a["steady_s_per_round"] / b["steady_s_per_round"]

    # ------------------------------------------------------------------ 3. profile, compile, CUDA graphs
    def profile(self, p: dict) -> None:
        from lightning.pytorch import Callback
        from torch.profiler import ProfilerActivity, profile

        s, dev = self.s, self.device
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        holder: dict = {}
        target = s.warmup + 1  # the round after the warm-up (1-based)

        class Prof(Callback):
            def on_train_batch_start(self, trainer, *a) -> None:
                if trainer.global_step + 1 == target:
                    sync(dev)
                    holder["prof"] = profile(activities=acts)
                    holder["prof"].__enter__()
                    holder["t"] = time.perf_counter()

            def on_train_batch_end(self, trainer, *a) -> None:
                if "t" in holder and "wall" not in holder:
                    sync(dev)
                    holder["wall"] = time.perf_counter() - holder["t"]
                    holder["prof"].__exit__(None, None, None)

        m = self.pfl_module("vmap", s.profile_cohort)
        trainer_for(dev, target, "32-true", callbacks=[Prof()]).fit(m, datamodule=self.pfl_data()())
        prof, wall = holder["prof"], holder["wall"]
        steps = math.ceil(s.images_per_client / s.batch_size)
        events = prof.key_averages()

        def dev_self(e):
            for name in ("self_device_time_total", "self_cuda_time_total"):
                if hasattr(e, name):
                    return float(getattr(e, name))
            return 0.0

        from torch.autograd import DeviceType

        kernels = [e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA]  # the kernels' own rows
        kernel_us = sum(dev_self(e) for e in kernels) if dev.type == "cuda" else None
        launches = sum(e.count for e in events if "LaunchKernel" in e.key)
        ops = [e for e in events if getattr(e, "device_type", None) != DeviceType.CUDA]
        cpu_ops_us = sum(e.self_cpu_time_total for e in ops if e.key.startswith("aten::"))
        key = lambda e: float(e.self_cpu_time_total)  # noqa: E731
        top = sorted(ops, key=key, reverse=True)[:12]
        p["top_kernels"] = [{"kernel": e.key[:120], "count": e.count, "device_ms": dev_self(e) / 1e3}
                            for e in sorted(kernels, key=dev_self, reverse=True)[:12]]
        p["cohort"], p["local_steps"], p["round_wall_s"] = s.profile_cohort, steps, wall
        p["per_step_wall_ms"] = wall * 1e3 / steps
        if kernel_us is not None:
            p["kernel_s"] = kernel_us / 1e6
            p["per_step_kernel_ms"] = kernel_us / 1e3 / steps
            p["per_step_overhead_ms"] = (wall * 1e6 - kernel_us) / 1e3 / steps
            p["kernel_fraction"] = kernel_us / 1e6 / wall
        p["kernel_launches"] = launches
        p["aten_self_cpu_s"] = cpu_ops_us / 1e6
        p["top_ops"] = [{"op": e.key, "count": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                         "self_device_ms": dev_self(e) / 1e3} for e in top]

    def compile_graphs(self, c: dict) -> None:
        from lfed.engine import CohortTrainer

        s, dev = self.s, self.device
        K, B = s.profile_cohort, s.batch_size
        torch.manual_seed(0)
        net = PflCNN(image_size=s.image_size, dropout=False).to(dev)  # no dropout: outputs comparable bit for bit
        tr = CohortTrainer(net, backend="vmap")
        g = torch.Generator().manual_seed(1)
        W = (tr.layout.module_vector(net).detach().cpu()[None] + 0.01 * torch.randn(K, tr.layout.num_params, generator=g)).to(dev)

        def inputs(seed):
            gg = torch.Generator().manual_seed(seed)
            x = torch.rand(K, B, 3, s.image_size, s.image_size, generator=gg).to(dev)
            y = torch.randint(0, 10, (K, B), generator=gg).to(dev)
            return tr.layout.unflatten(W.clone()), x, y, torch.ones(K, B, device=dev), {}

        def leaves(out):
            gr, loss = out
            return torch.cat([v.reshape(K, -1) for v in gr.values()] + [loss.reshape(K, 1)], 1)

        def timeit(fn, args):
            ts = []
            for _ in range(s.step_reps):
                sync(dev)
                t0 = time.perf_counter()
                fn(*args)
                sync(dev)
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts)

        args = inputs(2)
        ref = leaves(tr._vmapped(*args))
        variants = []
        eager_ms = timeit(tr._vmapped, args) * 1e3
        variants.append({"variant": "eager vmap(grad)", "ms": eager_ms, "max_diff": 0.0, "exact": True})
        tr._step(*args, whole=True)  # records
        recorded = next((fn for fn in tr._traced.values() if fn is not None), None)
        rec_ms = None
        if recorded is None:
            variants.append({"variant": "recorded (make_fx)", "status": "not recorded (lfed runs this step eagerly)"})
        else:
            out = leaves(recorded(*args))
            rec_ms = timeit(recorded, args) * 1e3
            variants.append({"variant": "recorded (make_fx)", "ms": rec_ms, "max_diff": diff(out, ref)[0],
                             "exact": bool(torch.equal(out, ref))})
        base = rec_ms or eager_ms

        def attempt(name, build):
            row = {"variant": name}
            try:
                t0 = time.perf_counter()
                fn = build()
                out = leaves(fn(*args))  # compiles / captures
                sync(dev)
                row["build_s"] = time.perf_counter() - t0
                row["ms"] = timeit(fn, args) * 1e3
                row["max_diff"], row["relative"] = diff(out, ref)
                row["exact"] = bool(torch.equal(out, ref))
                # a second input set: the same function on other data
                args2 = inputs(3)
                out2, ref2 = leaves(fn(*args2)), leaves(tr._vmapped(*args2))
                row["max_diff_other_inputs"] = diff(out2, ref2)[0]
                row["exact"] = row["exact"] and bool(torch.equal(out2, ref2))
                row["speedup_vs_lfed_step"] = base / row["ms"]
                row["keep"] = row["exact"] and row["ms"] < base * 0.95
                row["status"] = "ok"
            except Exception:  # noqa: BLE001
                row["status"] = "error"
                row["error"] = traceback.format_exc()
            variants.append(row)
            self.write()

        if self.budget_left() + s.reserve_s > 0:
            backend = self.args.compile_backend or s.compile_backend
            torch._dynamo.reset()
            attempt(f"torch.compile(vmapped step, backend={backend})",
                    lambda: torch.compile(lambda *a: tr._vmapped(*a), backend=backend, dynamic=False))
        else:
            variants.append({"variant": "torch.compile", "status": "skipped", "reason": "time budget"})
        if dev.type != "cuda":
            variants.append({"variant": "CUDA graph of the recorded step", "status": "skipped", "reason": "needs CUDA"})
        elif recorded is None:
            variants.append({"variant": "CUDA graph of the recorded step", "status": "skipped", "reason": "no recorded step"})
        else:
            def graphed():
                static = inputs(2)
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(3):
                        recorded(*static)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_out = recorded(*static)

                def run(params, x, y, mask, buffers):
                    for k in params:
                        static[0][k].copy_(params[k])
                    static[1].copy_(x)
                    static[2].copy_(y)
                    static[3].copy_(mask)
                    graph.replay()
                    return static_out

                return run

            attempt("CUDA graph of the recorded step (inputs copied in)", graphed)
        c["cohort"], c["batch"], c["variants"] = K, B, variants
        c["baseline"] = "lfed's recorded step" if rec_ms else "eager step"

    def run(self) -> int:
        self.section("environment", self.environment)
        self.section("correctness", self.correctness)
        self.section("timing", self.timing)
        self.section("profile", self.profile)
        self.section("compile_graphs", self.compile_graphs)
        self.write()
        self.tmp.cleanup()
        status = self.exit_status()
        print(markdown(self.result))
        print(f"[gpu_suite] done in {self.elapsed():.1f} s, exit status {status}; {self.out / 'gpu_suite.json'}", flush=True)
        return status


# ----------------------------------------------------------------------------- markdown


def _f(v, digits=4) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if math.isinf(v):
            return "inf"
        return f"{v:.{digits}g}"
    return str(v)


def _mem(c: dict) -> str:
    if "peak_device_mib" in c:
        return f"{c['peak_device_mib']:.0f} MiB (device)"
    if "peak_rss_mib" in c:
        return f"{c['peak_rss_mib']:.0f} MiB (RSS{'' if c.get('rss_reset') else ', not reset'})"
    return "-"


def markdown(r: dict) -> str:
    secs = r["sections"]
    L = [f"# lfed GPU suite: {r['device']}{' (--quick)' if r['quick'] else ''}", "",
         f"Elapsed {r.get('elapsed_s', 0):.1f} s, exit status {r.get('exit_status')}.", ""]
    for name, sec in secs.items():
        if sec.get("status") == "error":
            L += [f"**Section {name} raised** (traceback in gpu_suite.json):", "", "```", sec["error"].strip().splitlines()[-1], "```", ""]
    e = secs.get("environment", {})
    L += ["## Environment", "", "| | |", "| --- | --- |"]
    for k in ("device_name", "capability", "device_memory_gib", "python", "torch", "torch_cuda", "cudnn", "threads", "cpu_count",
              "tf32_matmul", "tf32_cudnn", "float32_matmul_precision", "platform"):
        if k in e:
            L.append(f"| {k} | {_f(e[k])} |")
    for k, v in e.get("imports", {}).items():
        L.append(f"| import {k} | {v} |")
    L.append("")
    checks = secs.get("correctness", {}).get("checks", [])
    L += ["## Correctness", "", "| check | tolerance | max diff seen | passed |", "| --- | --- | --- | --- |"]
    for c in checks:
        L.append(f"| {c['name']} | {c['tolerance']} | {_f(c['max_diff'], 3)}"
                 f"{' (rel ' + _f(c['relative'], 3) + ')' if 'relative' in c else ''} | {'PASS' if c['passed'] else '**FAIL**'} |")
    L.append("")
    t = secs.get("timing", {})
    if t:
        L += ["## Timing", "", t.get("job", ""), "", f"Model parameters: {t.get('params', 0):,}. {t.get('pfl_a100', '')}.", "",
              f"Steady s/round = median of the timed rounds (after {t.get('warmup_rounds')} warm-up rounds; at most "
              f"{t.get('max_timed_rounds')}, fewer once a case spent {t.get('case_cap_s')} s); evaluation not included.", "",
              "| case | status | steady s/round | timed rounds | vs plain loop | s per evaluation | peak memory |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in t.get("cases", []):
            if "grid" in c:
                continue
            status = c["status"] if c["status"] != "skipped" else f"skipped: {c.get('reason')}"
            ev = c.get("eval_s") or []
            L.append(f"| {c['name']} | {status if c['status'] != 'error' else 'ERROR'} | {_f(c.get('steady_s_per_round'))} | "
                     f"{len(c.get('timed_rounds', []))} | {_f(c.get('vs_plain_loop'), 3)} | {_f(statistics.median(ev)) if ev else '-'} | "
                     f"{_mem(c)} |")
        L += ["", "| grid | status | s/round | vs one after another | engine calls | peak memory |", "| --- | --- | --- | --- | --- | --- |"]
        for c in t.get("cases", []):
            if "grid" in c:
                status = c["status"] if c["status"] != "skipped" else f"skipped: {c.get('reason')}"
                L.append(f"| {c['name']} | {status if c['status'] != 'error' else 'ERROR'} | {_f(c.get('steady_s_per_round'))} | "
                         f"{_f(c.get('vs_one_after_another'), 3)} | {_f(c.get('engine_calls'))} | {_mem(c)} |")
        L.append("")
    p = secs.get("profile", {})
    if p.get("status") == "ok":
        L += ["## Profile of one lfed vmap round", "",
              f"Cohort {p['cohort']}, {p['local_steps']} local steps; round {p['round_wall_s'] * 1e3:.1f} ms wall, "
              f"{p['per_step_wall_ms']:.2f} ms per local step"
              + (f"; kernels {p['per_step_kernel_ms']:.2f} ms per step, launch + Python overhead {p['per_step_overhead_ms']:.2f} ms "
                 f"per step (kernel fraction {p['kernel_fraction']:.2f})" if "kernel_s" in p else "")
              + f"; {p['kernel_launches']} kernel launches; aten ops' self CPU time {p['aten_self_cpu_s'] * 1e3:.1f} ms. "
              "Top ops by self CPU time:", "",
              "| op | calls | self CPU ms | self device ms |", "| --- | --- | --- | --- |"]
        L += [f"| `{o['op'][:60]}` | {o['count']} | {o['self_cpu_ms']:.3f} | {o['self_device_ms']:.3f} |" for o in p["top_ops"]]
        if p.get("top_kernels"):
            L += ["", "Top kernels by device time:", "", "| kernel | calls | device ms |", "| --- | --- | --- |"]
            L += [f"| `{k['kernel'][:70].replace('|', '/')}` | {k['count']} | {k['device_ms']:.3f} |" for k in p["top_kernels"]]
        L.append("")
    cg = secs.get("compile_graphs", {})
    if cg.get("variants"):
        L += ["## The vmapped local step: eager, recorded, torch.compile, CUDA graph", "",
              f"Cohort {cg['cohort']}, batch {cg['batch']}, pfl CNN without dropout; baseline {cg['baseline']}; keep = exact "
              "on two input sets and >5% faster.", "",
              "| variant | status | ms/step | build s | max diff | exact | speed-up | keep |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for v in cg["variants"]:
            status = v.get("status", "ok")
            if status == "skipped":
                status = f"skipped: {v.get('reason')}"
            elif status == "error":
                status = "ERROR: " + v["error"].strip().splitlines()[-1][:80].replace("|", "/")
            L.append(f"| {v['variant']} | {status} | {_f(v.get('ms'))} | {_f(v.get('build_s'), 3)} | {_f(v.get('max_diff'), 3)} | "
                     f"{_f(v.get('exact'))} | {_f(v.get('speedup_vs_lfed_step'), 3)} | {_f(v.get('keep'))} |")
        L.append("")
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CPU CI)")
    ap.add_argument("--out", required=True, help="output folder (gpu_suite.json, gpu_suite.md)")
    ap.add_argument("--budget-s", type=float, default=None, help="whole-run time budget (default 480 s; --quick 120 s)")
    ap.add_argument("--case-cap-s", type=float, default=None, help="stop timing a case after this many timed seconds "
                    "(at least 3 timed rounds; default 20 s)")
    ap.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; --quick aot_eager)")
    args = ap.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 120.0 if args.quick else 480.0
    if args.case_cap_s is None:
        args.case_cap_s = 20.0
    from lfed.reporting import silence_library_noise

    silence_library_noise()
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    from lfed.algorithms import CompositionWarning

    warnings.filterwarnings("ignore", category=CompositionWarning)  # short test runs (few participations) are meant
    return Suite(args).run()


if __name__ == "__main__":
    sys.exit(main())
