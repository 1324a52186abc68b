"""One command that checks and times lfed on a device (issues 28 and 37): correctness, timings, profile, the limit.

    python benchmarks/gpu_suite.py --device cpu --quick --out /tmp/gpu_suite      # CI (tests/benchmarks/test_gpu_suite.py), < 1 min
    python3 benchmarks/gpu_suite.py --device cuda --out $OUT/gpu_suite           # on a GPU: at most --budget-s (480 s)

Writes ``<out>/gpu_suite.json`` (everything, rewritten after every section, check and timing case, so
a run killed at its time limit still leaves what it measured) and ``<out>/gpu_suite.md`` (tables).
One process (and, for set-up, one child process per measurement); the sections are independent: an
error in one is recorded (with its traceback) and the suite goes on. A row that cannot run here (a
package missing, a CUDA-only measurement on the CPU) says skipped and why; nothing is filled in.
Exit status: 0 all passed, 1 a correctness check failed, 2 a section or a case raised (and no check
failed).

0. environment: Python, torch, CUDA, cuDNN, device name and capability, TF32 flags, threads, and
   whether lightning / jsonargparse / wandb / torchvision / sklearn import. lfed is imported from
   this checkout (``sys.path``), driven through its Python API only (no ``lfed fit`` CLI, no
   jsonargparse, no wandb: the GPU machine has neither).
1. correctness on the device, each check with an explicit tolerance and the max difference seen:
   vmap vs loop backends in float64 (the quickstart's FedAvg MLP on digits; SmallCNN with SCAFFOLD,
   IGFL time attention, EFL with compression and stragglers); the quickstart on the device against
   the same run on the CPU in float32; a run stopped at round 3 and resumed to 6 against one of 6
   rounds, bit for bit on the device; ``client_state="host"`` (pinned memory on CUDA) against
   ``"device"``, bit for bit; every robust rule and every attack that draws no random numbers
   (docs/robustness.md) on a fixed float64 cohort of updates, on the device against the CPU.
2. set-up in its parts (section ``setup``): a fresh ``python -c`` child (cold imports) times, with
   ``time.perf_counter`` around each part, ``import torch``, ``import lightning.pytorch``, lfed's
   import, the device's initialisation, making the synthetic data, building the data module + module
   + trainer, ``fit`` to the first round (the data's move to the device included), the first round and
   the steady round of the timing job below at cohort 50 (quick: 2). lfed's own part = build + fit to
   the first round + the first round (imports excluded); issue 37 wants it under 1 s: recorded as
   ``lfed_own_under_1s``. 2 children (quick: 1); the medians are reported beside each child.
3. host synchronizations per round (section ``host_sync``): rounds 2-4 (quick: 2-3) of FedAvg (the
   quickstart), SCAFFOLD, DP-FedAvg (configs/dp_digits.yaml), Ditto and a LoRA run
   (configs/lora_digits.yaml; skipped without peft), each from ``on_train_batch_start`` to
   ``on_train_batch_end``: on CUDA the warnings of ``torch.cuda.set_sync_debug_mode("warn")`` per round
   (issue 37's target: at most 1); on the CPU that count is recorded as "not applicable on cpu". On
   every device the calls of ``aten._local_scalar_dense`` (``.item()``, ``bool``/``float``/``int`` of a
   tensor) per round, seen by a ``TorchDispatchMode``: the host-side count behind the syncs.
4. timing of pfl-research's CIFAR-10 benchmark job on SYNTHETIC CIFAR-shaped data (random images
   and labels, not CIFAR-10): 1,000 clients of 50 images, FedAvg, 1 local epoch of batch 10 (5
   local steps), pfl's 2-conv + 128-dense CNN (:class:`PflCNN`, 1,626,442 parameters at 32x32),
   evaluation every 10 rounds: steady seconds per round (median of the timed rounds, warm-up
   excluded, synchronized on CUDA) and peak device memory (``max_memory_allocated``, reset per case;
   on the CPU the peak RSS, reset per case through /proc/self/clear_refs where Linux allows it) at
   cohorts 50, 200 and 1,000 of:
   * lfed vmap, lfed loop (``FederatedModule`` under a Lightning ``Trainer``); at the smallest cohort also
     lfed vmap with its convolutions forced to each form (``LFED_CONV_FORM=native`` / ``matmul``,
     :mod:`lfed.engine.conv`: torch's grouped convolution against unfold + one batched matmul);
   * hand vmap: the ~60 lines of plain PyTorch of ../shared/gpu/2026-11-26-h200/README.md section 3
     (:meth:`Suite.hand_vmap_case`: the cohort's weights stacked, one eager ``vmap(grad(loss))`` per
     local step, SGD in place, the mean as the new model, the examples gathered from one device tensor);
   * centralized: the work of a round without federation (per local step, one forward/backward/SGD
     step of the single model over that step's K x B examples as one batch; same net, device, steps);
   * plain loop: one model, ``torch.optim.SGD`` per client, the weighted mean;
   * pfl (1 process), at cohorts 50 and 1,000: pfl-research itself (``SimulatedBackend``,
     ``FederatedAveraging``, ``PyTorchModel``) when ``import pfl`` works, else skipped with the reason
     "pfl not importable (...)" (its best of 2-5 processes is not run here);
   * a grid of 18 runs (6 client lrs x 3 seeds, cohort 50) as one group against the 18 runs one after
     another, with the group's throughput over one run's: run-rounds/s of the group over rounds/s of
     lfed vmap alone at that cohort.
   Every row gets TFLOP/s: examples per round x the FLOPs of one training step per example (forward +
   backward, counted once by ``torch.utils.flop_counter.FlopCounterMode``: 99.5 MFLOP at 32x32) over
   its steady s/round; the lfed rows their ratios to the plain loop, the hand vmap and the centralized
   row; and issue 37's GPU targets are listed with the measured ratios (lfed / hand vmap <= 1 and
   lfed / centralized <= 3 at cohort 50, <= 2 at 1,000; the grid's throughput >= 3x one run's).
5. a ``torch.profiler`` summary of one lfed vmap round (kernel time against launch and Python
   overhead per local step, top ops), and the vmapped local step eager / recorded (lfed's
   ``make_fx`` replay) / ``torch.compile``-d / replayed as a CUDA graph: each variant's time and
   its difference from the eager step; ``keep`` = exact (bit for bit) and faster than lfed's
   recorded step. Nothing in lfed is changed by this: it is the evidence for such a change.
6. bf16-mixed against float32 (section ``precision``): the timing job's lfed vmap round at cohort 50
   under ``Trainer(precision="bf16-mixed")`` and ``"32-true"``, and the test accuracy of the
   quickstart (digits MLP, 60 rounds; quick: 6) in both, seeds 0 and 1 (quick: 0).
7. a LoRA cohort against a peft loop (section ``lora``): ``benchmarks/adapters_cohort.py``'s
   ``measure`` in this process on the suite's device, K = 50 and 200 (quick: 2, a tiny model): lfed's
   engine against one peft model trained client after client, with client 0's adapters compared;
   skipped with the reason without peft.
8. the personalized evaluation of every client (section ``personal_eval``, ``benchmarks/personal_eval.py``'s
   helpers): Ditto's personal model set for every one of N = 1,000 and 10,000 clients (quick: 20),
   ``FederatedRun.personal_evaluation`` (vmapped) against a per-client ``functional_call`` loop, the
   accuracies checked equal.
9. a BatchNorm ResNet's local training (section ``resnet``, issue 53): ResNet-18 with BatchNorm, 50 clients of 64
   random 32x32 images, 5 steps of batch 32 (quick: a ResNet-20 of width 4, 2 clients, 8x8): one
   ``CohortTrainer.train`` call on the vmap backend (each client's running statistics its own row) against the loop
   backend, the centralized step over the same examples, and vmap with ``crop_flip`` redrawn every step; medians
   of 3 (quick: 1), interleaved. Not bounded by ``--budget-s``: run it alone with ``--sections resnet``.
10. example-level DP-SGD (section ``dp_sgd``, issue 54, ``benchmarks/dp_sgd_opacus.py``): K = 10, 100, 1,000 clients
   of the MNIST 2NN (quick: 2 clients of a tiny MLP) in one ``CohortTrainer.train`` call against Opacus client after
   client on the same Poisson batches; client 0's noise-free weights checked against Opacus's first. Skipped, with
   the reason, without opacus (carry its wheel). Not bounded by ``--budget-s``.

``--quick`` shrinks everything (a few clients, 12x12 images, a grid of 3 runs, the compile
backend ``aot_eager``, tiny LoRA and personalization jobs) so the suite runs on the CPU in well
under a minute (about 35 s of suite and 10 s of start-up on this 2-core machine).
``--budget-s`` (default 480 s) bounds the whole run: a timing case that would start past
``budget - reserve`` (the reserve, 240 s, is kept for sections 5-8), or whose estimate (its method's
last s/round scaled by the cohort) would overrun it, is recorded as skipped with the reason; the
cases of sections 6-8 are skipped the same way against what is left of the whole budget; a case also
stops timing once it has spent ``--case-cap-s`` with at least 3 timed rounds.

On the device tool's GPU machine (see /work/.library/device/README.md): it has no package index
and another torch (2.11 in Nov. 2026), with lightning, sklearn and torchvision but no wandb or
jsonargparse, none of which this suite needs (nor, there, pfl or peft: those rows say skipped); the
tool sends the session's own checkout (not a helper's worktree), so the suite must be committed
there first. Nothing needs carrying. One command, well inside the 10-minute limit of a call:

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
    lfed.models.zoo has no such model (McMahanCIFARCNN is the TF tutorial's 5x5 network).
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


# ----------------------------------------------------------------------------- set-up, in a fresh process

#: Run as ``python -c SETUP_CHILD '<json>'``: each part of a script's set-up timed with cold imports; prints one JSON line.
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
        # kept, in the timing section's budget, for the sections after it (profile, compile, precision, LoRA,
        # personalized evaluation); each of those checks what is left of --budget-s itself
        self.reserve_s = 0 if quick else 240
        self.pfl_cohorts = [2] if quick else [50, 1000]
        # set-up in a fresh process (cold imports)
        self.setup_children = 1 if quick else 2
        self.setup_cohort = 2 if quick else 50
        self.setup_rounds = 3 if quick else 5            # the first round, then steady rounds
        # host synchronizations per round (CUDA), _local_scalar_dense per round (every device)
        self.sync_warmup, self.sync_rounds = 1, 2 if quick else 3
        # bf16-mixed against 32-true
        self.precision_cohort = 2 if quick else 50
        self.precision_rounds = 6 if quick else 60       # the quickstart's accuracy run (60 rounds: configs/quickstart.yaml)
        self.precision_seeds = [0] if quick else [0, 1]
        # LoRA cohort against a peft loop (benchmarks/adapters_cohort.py)
        self.lora = (dict(sizes=[2], d_model=16, layers=1, heads=2, rank=4, batch=4, steps=2, rounds=1) if quick else
                     dict(sizes=[50, 200], d_model=128, layers=4, heads=4, rank=4, batch=16, steps=5, rounds=3))
        # personalized evaluation of every client against a per-client loop (benchmarks/personal_eval.py)
        self.personal = (dict(clients=[20], features=16, hidden=[16], repeat=1) if quick else
                         dict(clients=[1000, 10_000], features=784, hidden=[200, 200], repeat=3))
        # a BatchNorm ResNet's local training (issue 53): ResNet-18 at cohort 50 (quick: a ResNet-20 of width 4, cohort 2)
        self.resnet = (dict(model="ResNet20 width 4", cohort=2, image=8, per_client=16, steps=2, batch=8, repeats=1) if quick else
                       dict(model="ResNet18", cohort=50, image=32, per_client=64, steps=5, batch=32, repeats=3))
        # example-level DP-SGD in the cohort against an Opacus loop (issue 54; benchmarks/dp_sgd_opacus.py, the CPU table)
        self.dp_sgd = (dict(clients=[2], features=16, hidden=[16], repeats=1) if quick else
                       dict(clients=[10, 100, 1000], features=784, hidden=[200, 200], repeats=3))


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


class Skipped(Exception):  # noqa: N818 - a case that cannot run here; its message is the reason
    """Raised by a case that cannot run on this machine (a package missing, not on this device): recorded as skipped."""


def train_flops_per_example(image_size: int = 32, batch: int = 10) -> float:
    """FLOPs of one training step of :class:`PflCNN` per example: forward, loss and backward (weights' and
    activations' gradients, as autograd computes them), counted by ``torch.utils.flop_counter.FlopCounterMode``
    (matrix products and convolutions; element-wise ops and the SGD update are not counted) on one CPU batch."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    net = PflCNN(image_size=image_size, dropout=False)
    x = torch.rand(batch, 3, image_size, image_size)
    y = torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(net(x), y).backward()
    return counter.get_total_flops() / batch


class Suite:
    def __init__(self, args) -> None:
        self.args = args
        self.s = Settings(args.quick)
        if getattr(args, "cohorts", None):
            self.s.cohorts = sorted(args.cohorts)
            self.s.pfl_cohorts = [k for k in self.s.pfl_cohorts if k in self.s.cohorts] or self.s.cohorts[:1]
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

        from lfed.models.zoo import SmallCNN

        self.guarded(c, "vmap vs loop, float64: quickstart MLP (FedAvg)", f"relative <= {tol:g}",
                     lambda: vmap_loop("quickstart MLP (FedAvg)", None, "fedavg", s.correct_rounds))
        cnn_cases = {
            "scaffold": {},
            "igfl_s_time": {},
            "efl": {"channel": 0.3, "stragglers": {"p_inactive": 0.1, "p_incomplete": 0.4},
                    "objective": {"class_path": "lfed.client.objectives.EFL", "init_args": {"fisher_samples": 8}}},
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
            "efl": {"channel": 0.3, "stragglers": {"p_inactive": 0.1, "p_incomplete": 0.4},
                    "objective": {"class_path": "lfed.client.objectives.EFL", "init_args": {"fisher_samples": 8}}},
            "igfl_s_time": dict(stragglers={"p_inactive": 0.2}),
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
                m = self.quickstart("auto", torch.float32, "scaffold", engine={"client_state": placement}, stragglers={"p_incomplete": 0.3})
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

        def robust():
            """Every robust rule and every attack drawing no random numbers (docs/robustness.md) on a fixed float64
            [K=15, P=40] cohort of updates, on the device against the CPU; then Krum's pick is compared exactly."""
            from lfed.base.component import Cohort
            from lfed.core.registry import NAMES, build_component

            g = torch.Generator().manual_seed(0)
            x = torch.randn(15, 40, generator=g, dtype=torch.float64)
            a = torch.rand(15, generator=g, dtype=torch.float64)
            byz = torch.zeros(15, dtype=torch.bool)
            byz[:3] = True
            out, worst = {}, 0.0
            for where in ("cpu", str(dev)):
                d = torch.device(where)

                def cohort(d=d):
                    k = torch.arange(15)
                    co = Cohort(0, k.to(d), torch.full((15,), 2, device=d), torch.ones(15, dtype=torch.long, device=d),
                                torch.ones(15, dtype=torch.long, device=d), 15, counting=torch.ones(15, dtype=torch.bool, device=d),
                                expected_size=15.0, seed=0, byzantine=byz.to(d))
                    co.host_values().byzantine = byz
                    return co

                for name in NAMES["combination"]:
                    if name in ("dp_fedavg", "self", "global", "time", "fltrust", "secagg", "distributed_dp"):  # not robust rules
                        continue
                    rule = build_component("combination", name, **({} if name in ("mean", "geometric_median",
                                                                                  "centered_clipping", "norm_bound") else {"f": 3}))
                    if name == "centered_clipping":
                        from lfed.state.spec import ModuleStateStore

                        rule.setup_state(ModuleStateStore(), torch.ones(15), 40, x.to(d))
                    delta = rule.combine(x.to(d), a.to(d), cohort())
                    out.setdefault(f"rule {name}", []).append((delta[0] if isinstance(delta, tuple) else delta).cpu())
                for name in NAMES["attack"]:
                    if name in ("none", "gaussian", "label_flip", "backdoor"):
                        continue
                    attack = build_component("attack", name, per_round=3)
                    out.setdefault(f"attack {name}", []).append(attack.poison(x.to(d), cohort()).cpu())
            for cpu, there in out.values():
                worst = max(worst, diff(there, cpu)[1])
            tol = 1e-10
            self.check(c, f"robust rules and attacks, float64: {dev} vs cpu", worst <= tol, f"max|Δ| / max|x| <= {tol:g}",
                       worst, cases=len(out))

        self.guarded(c, f"robust rules and attacks, float64: {dev} vs cpu", "relative <= 1e-10", robust)

        def batch_norm():
            """A BatchNorm ResNet-20 with crop-and-flip augmentation (issue 53; docs/vision.md): the vmap backend on the
            device against the loop backend on the device and the vmap backend on the CPU, float64, weights and every
            running statistic, stragglers and partial batches included."""
            from lfed.data.augment import build_augmentation
            from lfed.engine import CohortTrainer, StepRule
            from lfed.models import ResNet20

            g = torch.Generator().manual_seed(0)
            x, y = torch.rand(48, 3, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 10, (48,), generator=g)
            index, sizes = torch.arange(48).view(4, 12), torch.tensor([12, 7, 10, 9])
            steps = torch.tensor([3, 2, 3, 1])
            torch.manual_seed(0)
            net = ResNet20(width=4).double()
            aug = build_augmentation("crop_flip")
            res = {}
            for where, backend in (("cpu", "vmap"), (str(dev), "vmap"), (str(dev), "loop")):
                d = torch.device(where)
                tr = CohortTrainer(net.to(d), backend=backend)
                r = tr.train(tr.layout.module_vector(net), x.to(d), y.to(d), index.to(d), sizes.to(d), steps, StepRule(),
                             0.05, 4, torch.Generator().manual_seed(1), augment=(aug, torch.Generator().manual_seed(2)))
                res[where, backend] = [r.weights.cpu(), *[b.cpu().double() for b in r.buffers.values()]]
            net.to("cpu")
            worst = 0.0
            ref = res["cpu", "vmap"]
            for key, got in res.items():
                for a, b in zip(got, ref):
                    worst = max(worst, diff(a, b)[1])
            tol = 1e-10
            self.check(c, f"BatchNorm ResNet-20 with augmentation, float64: vmap and loop on {dev} vs vmap on cpu",
                       worst <= tol, f"max|Δ| / max|x| <= {tol:g}", worst, tensors=len(ref))

        self.guarded(c, f"BatchNorm ResNet-20 with augmentation, float64: vmap and loop on {dev} vs vmap on cpu",
                     "relative <= 1e-10", batch_norm)

    # ------------------------------------------------------------------ 4. timing: the pfl CIFAR-10 job
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

    def lfed_case(self, backend: str, cohort: int, precision: str = "32-true", conv_form: str | None = None) -> dict:
        """``conv_form``: the vmap backend's form of the convolutions (lfed.engine.conv; None: lfed's rule, native on
        every device), set through ``LFED_CONV_FORM`` for this case only."""
        s = self.s
        clock = self.clock(s.warmup, self.args.case_cap_s)
        m = self.pfl_module(backend, cohort)
        reset_peak(self.device)
        start = time.perf_counter()
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

        def one_round() -> None:
            nonlocal glob
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

        return {**self.manual_rounds(one_round), "note": "no evaluation"}

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

    def round_batches(self, cohort: int, g: torch.Generator):
        """The round's clients and, per local step, their examples' indices ``[K, B]`` into the one data tensor
        (each client's examples in a fresh order, as every implementation here walks them)."""
        s, n = self.s, self.s.images_per_client
        clients = torch.randperm(s.num_clients, generator=g)[:cohort]
        order = torch.argsort(torch.rand(cohort, n, generator=g), dim=1) + clients[:, None] * n  # [K, n]
        order = order.to(self.device)
        return [order[:, lo:lo + s.batch_size] for lo in range(0, n, s.batch_size)]

    def manual_rounds(self, body) -> dict:
        """Time ``body()`` (one round) as the other cases are: warm-up rounds, then timed ones, synchronized, capped."""
        s, dev = self.s, self.device
        rounds: list[float] = []
        start = time.perf_counter()
        for _ in range(s.warmup + s.timed):
            sync(dev)
            t = time.perf_counter()
            body()
            sync(dev)
            rounds.append(time.perf_counter() - t)
            timed = rounds[s.warmup:]
            if len(timed) >= 3 and sum(timed) > self.args.case_cap_s:
                break
        timed = rounds[s.warmup:]
        return {"steady_s_per_round": statistics.median(timed), "timed_rounds": timed, "warmup_rounds": rounds[:s.warmup],
                "wall_s": time.perf_counter() - start, **peak_memory(dev)}

    def hand_vmap_case(self, cohort: int) -> dict:
        """The obvious hand-written vmapped FedAvg (../shared/gpu/2026-11-26-h200/README.md, section 3): the
        cohort's weights stacked, one eager ``vmap(grad(loss(functional_call)))`` per local step, SGD in place,
        the mean as the new model; the round's examples gathered from one device tensor. Dropout on, as in the
        lfed rows (``randomness="different"``: each client its own masks)."""
        from torch.func import functional_call, grad, vmap

        s, dev = self.s, self.device
        self.pfl_data()
        x, y = self._pfl_tensors[0].to(dev), self._pfl_tensors[1].to(dev)
        torch.manual_seed(0)
        model = PflCNN(image_size=s.image_size).to(dev).train()
        names = [name for name, _ in model.named_parameters()]
        state = {"glob": {name: q.detach().clone() for name, q in model.named_parameters()}}

        def loss(params, xb, yb):
            return F.cross_entropy(functional_call(model, params, (xb,)), yb)

        step_grad = vmap(grad(loss), randomness="different")
        g = torch.Generator().manual_seed(0)
        reset_peak(dev)

        def one_round():
            glob = state["glob"]
            w = {name: glob[name].expand(cohort, *glob[name].shape).clone() for name in names}
            for b in self.round_batches(cohort, g):  # b: [K, B]
                grads = step_grad(w, x[b], y[b])
                for name in names:
                    w[name].sub_(grads[name], alpha=0.05)
            state["glob"] = {name: w[name].mean(0) for name in names}  # equal sizes: the size-weighted mean

        return {**self.manual_rounds(one_round), "note": "no evaluation; dropout on (randomness='different')"}

    def centralized_case(self, cohort: int) -> dict:
        """The work of a round without federation: per local step of the round, one forward/backward/SGD step of
        the single model over that step's K x B examples as one batch (same net, same device, same gathers)."""
        s, dev = self.s, self.device
        self.pfl_data()
        x, y = self._pfl_tensors[0].to(dev), self._pfl_tensors[1].to(dev)
        torch.manual_seed(0)
        model = PflCNN(image_size=s.image_size).to(dev).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(0)
        reset_peak(dev)

        def one_round():
            for b in self.round_batches(cohort, g):
                idx = b.reshape(-1)
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()

        steps = math.ceil(s.images_per_client / s.batch_size)
        return {**self.manual_rounds(one_round), "steps_per_round": steps, "batch": cohort * s.batch_size,
                "note": f"{steps} steps of batch {cohort * s.batch_size} (K x B) a 'round'; no evaluation"}

    def pfl_case(self, cohort: int) -> dict:
        """pfl-research itself, one process: ``SimulatedBackend`` + ``FederatedAveraging`` + ``PyTorchModel``, its
        users' data given as device tensors (as in the shared README's section 3 and benchmarks/peers/pfl_job.py)."""
        try:
            import pfl
            from pfl.aggregate.simulate import SimulatedBackend
            from pfl.aggregate.weighting import WeightByDatapoints
            from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
            from pfl.callback.base import TrainingProcessCallback
            from pfl.data.federated_dataset import FederatedDataset
            from pfl.data.pytorch import PyTorchTensorDataset
            from pfl.data.sampling import get_user_sampler
            from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
            from pfl.metrics import Weighted
            from pfl.model.pytorch import PyTorchModel
        except Exception as err:  # noqa: BLE001
            raise Skipped(f"pfl not importable ({type(err).__name__}: {err})") from None
        s, dev, cap = self.s, self.device, self.args.case_cap_s
        self.pfl_data()
        x, y = self._pfl_tensors[0].to(dev), self._pfl_tensors[1].to(dev)
        n = s.images_per_client

        class Net(PflCNN):  # the methods pfl's PyTorchModel calls
            def loss(self, xb, yb, eval=False):  # noqa: A002 - pfl's signature
                self.eval() if eval else self.train()
                return F.cross_entropy(self(xb), yb)

            @torch.no_grad()
            def metrics(self, xb, yb, eval=True):  # noqa: A002
                self.eval()
                out = self(xb)
                return {"loss": Weighted(float(F.cross_entropy(out, yb, reduction="sum")), len(yb)),
                        "accuracy": Weighted(float((out.argmax(-1) == yb).sum()), len(yb))}

        marks: list[float] = []

        class Clock(TrainingProcessCallback):
            def on_train_begin(self, *, model):
                sync(dev)
                marks.append(time.perf_counter())
                return super().on_train_begin(model=model)

            def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
                sync(dev)
                marks.append(time.perf_counter())
                timed = [b - a for a, b in zip(marks[s.warmup:], marks[s.warmup + 1:])]
                return len(timed) >= 3 and sum(timed) > cap, type(aggregate_metrics)()

        def make_user(uid):
            perm = torch.randperm(n, device=dev) + uid * n
            return PyTorchTensorDataset((x[perm], y[perm]), user_id=uid)

        torch.manual_seed(0)
        net = Net(image_size=s.image_size).to(dev)
        model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                             central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
        data = FederatedDataset(make_user, get_user_sampler("minimize_reuse", list(range(s.num_clients))))
        rounds = s.warmup + s.timed
        reset_peak(dev)
        start = time.perf_counter()
        FederatedAveraging().run(
            algorithm_params=NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds + 1,
                                               train_cohort_size=cohort, val_cohort_size=0),
            backend=SimulatedBackend(training_data=data, val_data=None, postprocessors=[WeightByDatapoints()]),
            model=model,
            model_train_params=NNTrainHyperParams(local_learning_rate=0.05, local_num_epochs=1, local_batch_size=s.batch_size),
            model_eval_params=NNEvalHyperParams(local_batch_size=None),
            callbacks=[Clock()])
        per = [b - a for a, b in zip(marks, marks[1:])]
        return {"steady_s_per_round": statistics.median(per[s.warmup:]), "timed_rounds": per[s.warmup:],
                "warmup_rounds": per[:s.warmup], "wall_s": time.perf_counter() - start, "pfl_version": pfl.__version__,
                "note": "one process; no evaluation", **peak_memory(dev)}

    def timing(self, t: dict) -> None:
        s = self.s
        t["job"] = (f"pfl-research CIFAR-10 benchmark job on SYNTHETIC CIFAR-shaped data (random images, random labels): "
                    f"{s.num_clients} clients x {s.images_per_client} images of 3x{s.image_size}x{s.image_size}, FedAvg, "
                    f"1 local epoch, batch {s.batch_size}, client lr 0.05, pfl's CNN, evaluation every {s.evaluate_every} rounds "
                    f"(on {s.test_images} test images)")
        t["params"] = sum(p.numel() for p in PflCNN(image_size=s.image_size).parameters())
        t["pfl_a100"] = PFL_A100_NOTE
        t["warmup_rounds"], t["max_timed_rounds"], t["case_cap_s"] = s.warmup, s.timed, self.args.case_cap_s
        self.flops_per_example = train_flops_per_example(s.image_size, s.batch_size)
        t["train_flops_per_example"] = self.flops_per_example
        t["flops_note"] = ("TFLOP/s = examples per round x FLOPs of one training step per example (forward + backward, "
                           "torch.utils.flop_counter.FlopCounterMode: matrix products and convolutions only) / steady s per round")
        last: dict[str, tuple[int, float]] = {}
        methods = {"lfed vmap": lambda k: self.lfed_case("vmap", k), "lfed loop": lambda k: self.lfed_case("loop", k),
                   "lfed vmap, native conv": lambda k: self.lfed_case("vmap", k, conv_form="native"),
                   "lfed vmap, matmul conv": lambda k: self.lfed_case("vmap", k, conv_form="matmul"),
                   "plain loop": self.plain_case, "hand vmap": self.hand_vmap_case, "centralized": self.centralized_case,
                   "pfl (1 process)": self.pfl_case}
        # cheap and telling first: vmap at every cohort, the hand-written vmap and the centralized step, pfl at the
        # smallest cohort, then the loops, the grid, the loops and pfl at the largest cohort last
        order = [("lfed vmap", k) for k in s.cohorts]
        # the convolutions' two forms (lfed.engine.conv) forced, at the smallest cohort: the rule's choice against the other
        order += [("lfed vmap, native conv", s.cohorts[0]), ("lfed vmap, matmul conv", s.cohorts[0])]
        order += [(m, k) for m in ("hand vmap", "centralized") for k in s.cohorts]
        order += [("pfl (1 process)", k) for k in s.pfl_cohorts[:1]]
        order += [(m, k) for k in s.cohorts[:-1] for m in ("lfed loop", "plain loop")]
        tail = [(m, s.cohorts[-1]) for m in ("lfed loop", "plain loop")] + [("pfl (1 process)", k) for k in s.pfl_cohorts[1:]]
        for method, k in order:
            self._time_method(t, methods, last, method, k)
        self.section_grid(t)
        for method, k in tail:
            self._time_method(t, methods, last, method, k)
        by = {(c["method"], c["cohort"]): c for c in t["cases"] if "cohort" in c}
        for (_, k), c in by.items():
            if c.get("status") != "ok":
                continue
            for key, ref in (("vs_plain_loop", "plain loop"), ("vs_hand_vmap", "hand vmap"), ("vs_centralized", "centralized")):
                r = by.get((ref, k))
                if r and r.get("status") == "ok":
                    c[key] = c["steady_s_per_round"] / r["steady_s_per_round"]
        t["targets"] = self.targets(by, t)

    def targets(self, by: dict, t: dict) -> list[dict]:
        """Issue 37's targets for the GPU, each with the measured ratio (None: a side not measured in this run)."""
        s, out = self.s, []

        def ratio(k, a, b):
            x, y = by.get((a, k)), by.get((b, k))
            if x and y and x.get("status") == "ok" and y.get("status") == "ok":
                return x["steady_s_per_round"] / y["steady_s_per_round"]
            return None

        small, large = s.cohorts[0], s.cohorts[-1]
        for name, value, bound in ((f"lfed vmap / hand vmap, cohort {small}", ratio(small, "lfed vmap", "hand vmap"), 1.0),
                                   (f"lfed vmap / centralized, cohort {small}", ratio(small, "lfed vmap", "centralized"), 3.0),
                                   (f"lfed vmap / centralized, cohort {large}", ratio(large, "lfed vmap", "centralized"), 2.0)):
            out.append({"target": f"{name} <= {bound:g}", "value": value, "met": None if value is None else value <= bound})
        group = next((c for c in t.get("cases", []) if c.get("grid") == "group"), None)
        value = group.get("throughput_vs_one_run") if group else None
        out.append({"target": f"grid of {len(s.grid_lrs) * len(s.grid_seeds)} as one group: throughput >= 3x one run's",
                    "value": value, "met": None if value is None else value >= 3.0})
        return out

    def _time_method(self, t, methods, last, method, k) -> None:
        s = self.s
        est = None
        if method in last:
            k0, sec = last[method]
            est = sec * (k / k0) * (s.warmup + 3) * 1.5 + 5
        case = self.timed_case(t, {"name": f"{method}, cohort {k}", "method": method, "cohort": k,
                                   "examples_per_round": k * s.images_per_client}, lambda: methods[method](k), est)
        if case["status"] == "ok":
            last[method] = (k, case["steady_s_per_round"])

    def section_grid(self, t: dict) -> None:
        from lfed.lightning.group import GroupMember, RunGroup

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
        work = n * k * s.images_per_client
        a = self.timed_case(t, {"name": f"grid of {n} runs as one group, cohort {k}", "grid": "group", "runs": n,
                                "examples_per_round": work}, group, None)
        b = self.timed_case(t, {"name": f"grid of {n} runs one after another, cohort {k}", "grid": "sequential", "runs": n,
                                "examples_per_round": work}, sequential, est)
        if a["status"] == "ok" and b["status"] == "ok":
            a["vs_one_after_another"] = a["steady_s_per_round"] / b["steady_s_per_round"]
        one = next((c for c in vm if c.get("cohort") == k), None)
        if a["status"] == "ok" and one:
            # run-rounds per second of the group over rounds per second of one run alone (lfed vmap at this cohort)
            a["run_rounds_per_s"] = n / a["steady_s_per_round"]
            a["one_run_rounds_per_s"] = 1 / one["steady_s_per_round"]
            a["throughput_vs_one_run"] = a["run_rounds_per_s"] / a["one_run_rounds_per_s"]

    # ------------------------------------------------------------------ 5. profile, compile, CUDA graphs
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

    # ------------------------------------------------------------------ 2. set-up in its parts (a fresh process)
    def setup(self, e: dict) -> None:
        import subprocess

        s = self.s
        cfg = {"repo": str(REPO), "bench": str(Path(__file__).resolve().parent), "device": str(self.device),
               "clients": s.num_clients, "images": s.images_per_client, "image_size": s.image_size, "test": s.test_images,
               "cohort": s.setup_cohort, "rounds": s.setup_rounds}
        e["job"] = (f"the timing section's job at cohort {s.setup_cohort}, lfed vmap, {s.setup_rounds} rounds, no evaluation, "
                    "in a fresh `python -c` process (cold imports), each part timed with time.perf_counter")
        e["lfed_own_parts"] = "build_s + fit_to_first_round_s + first_round_s (imports, device init and synthetic data excluded)"
        children = e.setdefault("children", [])
        env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONWARNINGS": "ignore"}
        for i in range(s.setup_children):
            if i and self.budget_left() < 60:
                children.append({"status": "skipped", "reason": "time budget"})
                break
            done = subprocess.run([sys.executable, "-c", SETUP_CHILD, json.dumps(cfg)], cwd=REPO, env=env, capture_output=True,
                                  text=True, timeout=max(60.0, min(300.0, self.budget_left(False))))
            if done.returncode:
                raise RuntimeError(f"set-up child exited {done.returncode}:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["lfed_own_s"] = row["build_s"] + row["fit_to_first_round_s"] + row["first_round_s"]
            row["lfed_own_under_1s"] = row["lfed_own_s"] < 1.0
            row["load_after"] = os.getloadavg()[0]
            children.append(row)
            self.write()
        ok = [c for c in children if "lfed_own_s" in c]
        keys = ("import_torch_s", "import_lightning_s", "import_lfed_s", "device_init_s", "synthetic_data_s", "build_s",
                "fit_to_first_round_s", "first_round_s", "steady_round_s", "to_first_round_s", "lfed_own_s")
        e["median"] = {k: statistics.median(c[k] for c in ok) for k in keys}
        e["lfed_own_under_1s"] = e["median"]["lfed_own_s"] < 1.0

    # ------------------------------------------------------------------ 3. host synchronizations per round
    def sync_cases(self) -> dict:
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
            "fedavg (quickstart)": (lambda: self.quickstart("auto"), self.digits),
            "scaffold": (lambda: self.quickstart("auto", algorithm="scaffold"), self.digits),
            "dp_fedavg (configs/dp_digits.yaml)": (
                dp, lambda: FederatedDataModule(dataset="digits", num_clients=100, partition="dirichlet", rho=0.5)),
            "ditto": (lambda: self.quickstart("auto", algorithm="ditto"), self.digits),
            "lora (configs/lora_digits.yaml)": (lora, self.digits),
        }

    def host_sync(self, h: dict) -> None:
        from lightning.pytorch import Callback, seed_everything
        from torch.utils._python_dispatch import TorchDispatchMode

        s, dev = self.s, self.device
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
        for name, (make, data) in self.sync_cases().items():
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
            self.write()
        h["cases"] = [{"name": r["run"], "status": r["status"]} for r in rows]  # errors count in the exit status

    # ------------------------------------------------------------------ 6. bf16-mixed against float32
    def precision(self, p: dict) -> None:
        s = self.s
        k = s.precision_cohort
        p["round_job"] = f"the timing section's job, lfed vmap, cohort {k}: steady s/round under the Trainer's precision"
        flops = getattr(self, "flops_per_example", None) or train_flops_per_example(s.image_size, s.batch_size)
        self.flops_per_example = flops
        rounds = {}
        for precision in ("32-true", "bf16-mixed"):
            est = None
            if "32-true" in rounds and rounds["32-true"].get("status") == "ok":
                est = rounds["32-true"]["steady_s_per_round"] * (s.warmup + s.timed) * 2 + 10
            rounds[precision] = self.timed_case(
                p, {"name": f"lfed vmap, cohort {k}, precision {precision}", "precision": precision, "cohort": k,
                    "examples_per_round": k * s.images_per_client},
                lambda pr=precision: self.lfed_case("vmap", k, precision=pr), est, reserve=False)
        a, b = rounds["bf16-mixed"], rounds["32-true"]
        if a["status"] == "ok" and b["status"] == "ok":
            p["bf16_over_fp32_round"] = a["steady_s_per_round"] / b["steady_s_per_round"]
        p["accuracy_job"] = (f"the quickstart (digits, 20 clients, MLP 64-200-200-10, FedAvg) for {s.precision_rounds} rounds, "
                             f"seeds {s.precision_seeds}: the test accuracy after the last round")
        acc = p.setdefault("accuracy", [])
        for seed in s.precision_seeds:
            for precision in ("32-true", "bf16-mixed"):
                row = {"seed": seed, "precision": precision}
                if self.budget_left(False) < 15:
                    row.update(status="skipped", reason="time budget")
                else:
                    try:
                        from lightning.pytorch import seed_everything

                        m = self.quickstart("auto", seed=seed)
                        seed_everything(seed, verbose=False)
                        start = time.perf_counter()
                        trainer_for(self.device, s.precision_rounds, precision, evaluate_every=min(10, s.precision_rounds)).fit(
                            m, datamodule=self.digits())
                        row.update(status="ok", test_acc=m.eval_history[-1][1], rounds=m.eval_history[-1][0],
                                   wall_s=time.perf_counter() - start)
                    except Exception:  # noqa: BLE001
                        row.update(status="error", error=traceback.format_exc())
                acc.append(row)
                self.write()
        got = {(r["seed"], r["precision"]): r["test_acc"] for r in acc if r["status"] == "ok"}
        diffs = [got[(sd, "bf16-mixed")] - got[(sd, "32-true")] for sd in s.precision_seeds
                 if (sd, "bf16-mixed") in got and (sd, "32-true") in got]
        if diffs:
            p["acc_bf16_minus_fp32"] = diffs
        p["cases"] = p.get("cases", []) + [{"name": f"accuracy seed {r['seed']} {r['precision']}", "status": r["status"]}
                                           for r in acc]

    # ------------------------------------------------------------------ 7. a LoRA cohort against a peft loop
    def lora(self, e: dict) -> None:
        import argparse as _argparse

        s = self.s
        cfg = s.lora
        e["job"] = (f"`benchmarks/adapters_cohort.py` in this process: K clients x {cfg['steps']} full-batch SGD steps on "
                    f"{cfg['batch']} random 80-character windows, rank-{cfg['rank']} LoRA on every linear layer of a "
                    f"CharTransformer (d {cfg['d_model']}, {cfg['layers']} layers): lfed's engine (vmap) against one peft "
                    f"model trained client after client; 1 warm-up round, {cfg['rounds']} timed")
        bench = str(Path(__file__).resolve().parent)
        if bench not in sys.path:
            sys.path.insert(0, bench)
        try:
            import peft  # noqa: F401
            reason = None
        except Exception as err:  # noqa: BLE001
            reason = f"peft not importable ({type(err).__name__}: {err})"
        last: dict[str, tuple[int, float]] = {}
        for k in cfg["sizes"]:
            for method in ("lfed", "peft_loop"):
                def one(method=method, k=k):
                    if reason:
                        raise Skipped(reason)
                    import adapters_cohort

                    ns = _argparse.Namespace(method=method, k=k, d_model=cfg["d_model"], layers=cfg["layers"], heads=cfg["heads"],
                                             rank=cfg["rank"], batch=cfg["batch"], steps=cfg["steps"], lr=0.1,
                                             rounds=cfg["rounds"], device=str(self.device), check=True, chunk="auto")
                    reset_peak(self.device)
                    out = adapters_cohort.measure(ns)
                    out["steady_s_per_round"] = out.pop("seconds_per_round")
                    return out

                est = None
                if method in last:
                    k0, sec = last[method]
                    est = sec * (k / k0) * (cfg["rounds"] + 1) * 1.5 + 5
                case = self.timed_case(e, {"name": f"{method}, K {k}", "method": method, "K": k}, one, est, reserve=False)
                if case["status"] == "ok":
                    last[method] = (k, case["steady_s_per_round"])
            by = {c["method"]: c for c in e["cases"] if c.get("K") == k and c["status"] == "ok"}
            if len(by) == 2:
                a, b = torch.tensor(by["lfed"].pop("check")["W"]), torch.tensor(by["peft_loop"].pop("check")["W"])
                by["lfed"]["loop_over_lfed"] = by["peft_loop"]["steady_s_per_round"] / by["lfed"]["steady_s_per_round"]
                by["lfed"]["client0_max_abs_diff_vs_loop"] = float((a - b).abs().max()) if a.shape == b.shape else math.inf
                by["lfed"]["client0_max_abs_w"] = float(b.abs().max())
            for c in by.values():
                c.pop("check", None)
            self.write()

    # ------------------------------------------------------------------ 8. personalized evaluation of every client
    def personal(self, e: dict) -> None:
        bench = str(Path(__file__).resolve().parent)
        if bench not in sys.path:
            sys.path.insert(0, bench)
        import personal_eval as pe

        cfg = self.s.personal
        acc = "gpu" if self.device.type == "cuda" else "cpu"
        e["job"] = (f"`benchmarks/personal_eval.py`'s evaluation: N clients of 20 training and 5 held-out examples of "
                    f"{cfg['features']} features, MLP {cfg['hidden']}, Ditto's personal model set for every client: "
                    "FederatedRun.personal_evaluation (vmapped, 256 clients a call) against a per-client loop "
                    f"(functional_call per client), medians of {cfg['repeat']} taken in turn; the accuracies checked equal")

        def case(N):
            from lfed.engine.ranks import Ranks
            from lfed.personal.ditto import Ditto

            params = sum(a * b + b for a, b in zip([cfg["features"], *cfg["hidden"]], [*cfg["hidden"], 10]))
            placement = "host" if N * params * 4 > 2**31 else "device"
            dm = pe.synthetic(N, 20, 5, cfg["features"])
            m = pe.module(Ditto(lam=0.1), cfg["features"], cfg["hidden"], acc, evaluation={"personal_chunk": 256},
                          engine={"client_state": placement})
            pe.fit(m, dm, 1, acc)
            run = m.runs[0]
            clients = run.personal_sample()
            w = run.layout.module_vector(run.net)
            g = torch.Generator().manual_seed(1)
            for lo in range(0, clients.numel(), 256):
                c = clients[lo:lo + 256]
                m.objective.write_rows("personal", c, w + 0.01 * torch.randn(c.numel(), w.numel(), generator=g).to(w.device, w.dtype))
            evaluated = (run.client_accuracy(), None)

            def vmapped():
                return run.personal_evaluation(evaluated, Ranks(), lambda t: t, False, 2048)

            def row_of(k):
                return m.objective.rows("personal", torch.tensor([k], device=clients.device), first=w)[0]

            t_vmap, t_loop = pe.interleaved([vmapped, lambda: pe.one_by_one(run, clients, row_of)], cfg["repeat"])
            first = run.last_personal["personal"].clone()
            vmapped()
            repeatable = bool((run.last_personal["personal"] == first).all())
            agree = pe.agreement(run, clients, row_of, pe.one_by_one(run, clients, row_of), run.last_personal["personal"])
            agree["vmapped_repeatable"] = repeatable
            same = agree["equal"]
            if not agree["explained"]:
                raise AssertionError(f"the vmapped and the per-client evaluation disagree beyond float32 near-ties: {agree}")
            return {"steady_s_per_round": t_vmap, "vmapped_s": t_vmap, "loop_s": t_loop, "loop_over_vmapped": t_loop / t_vmap,
                    "client_state": placement, "params": params, "accuracies_equal": same,
                    "clients_differing_by_near_ties": agree["clients_differing"], **peak_memory(self.device)}

        last = None
        for N in cfg["clients"]:
            est = None if last is None else last[1] * (N / last[0]) * (2 * cfg["repeat"] + 2) + 10
            c = self.timed_case(e, {"name": f"personalized evaluation, N {N}", "N": N}, lambda N=N: case(N), est, reserve=False)
            if c["status"] == "ok":
                last = (N, c["loop_s"] + c["vmapped_s"])

    # ------------------------------------------------------------------ 9. a BatchNorm ResNet's local training (issue 53)
    def resnet(self, r: dict) -> None:
        """One call of ``CohortTrainer.train``: K clients of random 3 x image x image inputs, ``steps`` local steps of
        ``batch``, the BatchNorm ResNet on the vmap backend (each client's running statistics its own row) against the
        loop backend and the centralized step (one net, the same steps over the cohort's K x batch examples at once),
        and vmap with ``crop_flip`` redrawn every step; medians of ``repeats`` after a warm-up call of each."""
        bench = str(Path(__file__).resolve().parent)
        if bench not in sys.path:
            sys.path.insert(0, bench)
        import resnet_round as rr  # its cohort and centralized calls (benchmarks/resnet_round.py, the CPU table)

        from lfed.models import ResNet18, ResNet20

        cfg, dev = self.s.resnet, self.device

        def make():
            torch.manual_seed(0)
            net = ResNet18() if cfg["model"] == "ResNet18" else ResNet20(width=4)
            return net.to(dev)

        k, n, steps, batch = cfg["cohort"], cfg["per_client"], cfg["steps"], cfg["batch"]
        g = torch.Generator().manual_seed(0)
        x = torch.rand(k * n, 3, cfg["image"], cfg["image"], generator=g).to(dev)
        y = torch.randint(0, 10, (k * n,), generator=g).to(dev)
        index, sizes = torch.arange(k * n, device=dev).view(k, n), torch.full((k,), n, device=dev)
        r["job"] = (f"{cfg['model']} with BatchNorm, {k} clients of {n} random 3x{cfg['image']}x{cfg['image']} images, "
                    f"{steps} local steps of batch {batch}: one CohortTrainer.train call; centralized = one net taking the same "
                    f"steps over the cohort's {k} x {batch} examples at once; medians of {cfg['repeats']}")
        variants = {"lfed vmap": rr.lfed_call(make(), "vmap", x, y, index, sizes, steps, batch),
                    "lfed loop": rr.lfed_call(make(), "loop", x, y, index, sizes, steps, batch),
                    "centralized": rr.centralized_call(make(), x, y, index, steps, batch),
                    "lfed vmap, crop_flip": rr.lfed_call(make(), "vmap", x, y, index, sizes, steps, batch, augment=True)}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for call in variants.values():  # warm-up
            call()
        for _ in range(cfg["repeats"]):  # interleaved
            for name, call in variants.items():
                sync(dev)
                start = time.perf_counter()
                call()
                sync(dev)
                times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(v) for name, v in times.items()}
        r["cases"] = [{"name": name, "s_per_call": med[name], "vs_centralized": med[name] / med["centralized"],
                       "vs_loop": med[name] / med["lfed loop"]} for name in variants]
        r.update(peak_memory(dev))

    def dp_sgd(self, r: dict) -> None:
        """Example-level DP-SGD: one ``CohortTrainer.train`` call of K clients (per-example gradients vmapped inside the
        cohort's vmap) against Opacus's ``GradSampleModule`` + ``DPOptimizer`` client after client on the same Poisson
        batches (benchmarks/dp_sgd_opacus.py: 60 examples, 6 steps of expected batch 10 per client); medians of
        ``repeats`` after a warm-up, interleaved. Checked first: without noise, client 0's weights equal Opacus's."""
        bench = str(Path(__file__).resolve().parent)
        if bench not in sys.path:
            sys.path.insert(0, bench)
        try:
            import opacus  # noqa: F401
        except ImportError:
            r["skipped"] = "opacus is not installed"
            return
        import dp_sgd_opacus as dps

        from lfed.models.zoo import MLP

        cfg, dev = self.s.dp_sgd, self.device
        torch.manual_seed(0)
        net = MLP(cfg["features"], cfg["hidden"], 10)
        r["job"] = (f"MLP {cfg['features']}-{'-'.join(map(str, cfg['hidden']))}-10, K clients of {dps.N_EXAMPLES} "
                    f"examples, {dps.STEPS} DP-SGD steps of expected batch {dps.BATCH} (C = {dps.CLIP}, sigma = {dps.SIGMA}); "
                    f"lfed: one CohortTrainer.train call; Opacus: client after client; medians of {cfg['repeats']}")
        g = torch.Generator().manual_seed(0)
        k0 = cfg["clients"][0]
        X = torch.randn(k0 * dps.N_EXAMPLES, cfg["features"], generator=g).to(dev)
        Y = torch.randint(0, 10, (k0 * dps.N_EXAMPLES,), generator=g).to(dev)
        _, ours = dps.lfed_round(net, X, Y, k0, noise=0.0, weights=True)
        _, theirs = dps.opacus_round(net, X, Y, k0, noise=0.0, weights=True)
        r["max_diff_vs_opacus_noise0"] = float((ours[0] - theirs).abs().max())
        r["cases"] = []
        for K in cfg["clients"]:
            X = torch.randn(K * dps.N_EXAMPLES, cfg["features"], generator=g).to(dev)
            Y = torch.randint(0, 10, (K * dps.N_EXAMPLES,), generator=g).to(dev)
            dps.lfed_round(net, X, Y, K)  # warm-up
            dps.opacus_round(net, X, Y, min(K, 2))
            times = {"lfed": [], "opacus": []}
            for _ in range(cfg["repeats"]):
                times["lfed"].append(dps.lfed_round(net, X, Y, K))
                times["opacus"].append(dps.opacus_round(net, X, Y, K))
            med = {n: statistics.median(v) for n, v in times.items()}
            r["cases"].append({"clients": K, "lfed_s": med["lfed"], "opacus_s": med["opacus"],
                               "opacus_over_lfed": med["opacus"] / med["lfed"]})
        r.update(peak_memory(dev))

    def run(self) -> int:
        wanted = getattr(self.args, "sections", None)
        for name, fn in (("environment", self.environment), ("correctness", self.correctness), ("setup", self.setup),
                         ("host_sync", self.host_sync), ("timing", self.timing), ("profile", self.profile),
                         ("compile_graphs", self.compile_graphs), ("precision", self.precision), ("lora", self.lora),
                         ("personal_eval", self.personal), ("resnet", self.resnet), ("dp_sgd", self.dp_sgd)):
            if name == "environment" or not wanted or name in wanted:
                self.section(name, fn)
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


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _status(c: dict) -> str:
    st = c.get("status", "-")
    if st == "skipped":
        return f"skipped: {c.get('reason')}"
    if st == "error":
        return "ERROR: " + c.get("error", "").strip().splitlines()[-1][:80].replace("|", "/") if c.get("error") else "ERROR"
    return st


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
              f"{t.get('flops_note', '-')}; {_f(t.get('train_flops_per_example', 0) / 1e6)} MFLOP per example here. "
              "*centralized*: the same steps as a round, each over the round's K x B examples as one batch of one model. "
              "*hand vmap*: the shared README's ~60 lines (stacked weights, eager vmap(grad) per step, the mean).", "",
              "| case | status | steady s/round | TFLOP/s | timed rounds | vs plain loop | vs hand vmap | vs centralized | "
              "s per evaluation | peak memory |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in t.get("cases", []):
            if "grid" in c:
                continue
            ev = c.get("eval_s") or []
            L.append(f"| {c['name']} | {_status(c)} | {_f(c.get('steady_s_per_round'))} | {_f(c.get('tflops'), 3)} | "
                     f"{len(c.get('timed_rounds', []))} | {_f(c.get('vs_plain_loop'), 3)} | {_f(c.get('vs_hand_vmap'), 3)} | "
                     f"{_f(c.get('vs_centralized'), 3)} | {_f(statistics.median(ev)) if ev else '-'} | {_mem(c)} |")
        L += ["", "Grid: throughput vs one run = the group's run-rounds per second over one run's rounds per second "
              "(lfed vmap at the same cohort, above).", "",
              "| grid | status | s/round | TFLOP/s | run-rounds/s | throughput vs one run | vs one after another | engine calls | "
              "peak memory |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in t.get("cases", []):
            if "grid" in c:
                L.append(f"| {c['name']} | {_status(c)} | {_f(c.get('steady_s_per_round'))} | {_f(c.get('tflops'), 3)} | "
                         f"{_f(c.get('run_rounds_per_s'), 3)} | {_f(c.get('throughput_vs_one_run'), 3)} | "
                         f"{_f(c.get('vs_one_after_another'), 3)} | {_f(c.get('engine_calls'))} | {_mem(c)} |")
        if t.get("targets"):
            L += ["", "Issue 37's targets (on a GPU; '-' = a side not measured in this run):", "", "| target | value | met |",
                  "| --- | --- | --- |"]
            L += [f"| {g['target']} | {_f(g['value'], 3)} | {_f(g['met'])} |" for g in t["targets"]]
        L.append("")
    rn = secs.get("resnet", {})
    if rn.get("cases"):
        L += ["## A BatchNorm ResNet's local training (issue 53)", "", rn.get("job", ""), "",
              "| variant | s per call | vs centralized | vs lfed loop |", "| --- | --- | --- | --- |"]
        L += [f"| {c['name']} | {_f(c['s_per_call'])} | {_f(c['vs_centralized'], 3)} | {_f(c['vs_loop'], 3)} |" for c in rn["cases"]]
        L.append("")
    dps = secs.get("dp_sgd", {})
    if dps.get("cases"):
        L += ["## Example-level DP-SGD: the vmapped cohort against an Opacus loop (issue 54)", "", dps.get("job", ""), "",
              f"Without noise, client 0's weights against Opacus's: max difference {_f(dps.get('max_diff_vs_opacus_noise0'), 3)}.",
              "", "| clients | lfed s | Opacus s | Opacus / lfed |", "| --- | --- | --- | --- |"]
        L += [f"| {c['clients']} | {_f(c['lfed_s'])} | {_f(c['opacus_s'])} | {_f(c['opacus_over_lfed'], 3)} |"
              for c in dps["cases"]]
        L.append("")
    su = secs.get("setup", {})
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
    hs = secs.get("host_sync", {})
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
    pr = secs.get("precision", {})
    if pr.get("cases"):
        L += ["## bf16-mixed against float32", "", _cap(pr.get("round_job", "")), "", "| case | status | steady s/round | TFLOP/s | peak memory |",
              "| --- | --- | --- | --- | --- |"]
        L += [f"| {c['name']} | {_status(c)} | {_f(c.get('steady_s_per_round'))} | {_f(c.get('tflops'), 3)} | {_mem(c)} |"
              for c in pr["cases"] if "precision" in c]
        L += ["", f"bf16-mixed / 32-true round: {_f(pr.get('bf16_over_fp32_round'), 3)}. {_cap(pr.get('accuracy_job', ''))}:", "",
              "| seed | precision | status | test acc | wall s |", "| --- | --- | --- | --- | --- |"]
        L += [f"| {r['seed']} | {r['precision']} | {_status(r)} | {_f(r.get('test_acc'))} | {_f(r.get('wall_s'), 3)} |"
              for r in pr.get("accuracy", [])]
        L += ["", f"Test accuracy, bf16-mixed minus 32-true per seed: {_f(pr.get('acc_bf16_minus_fp32'))}.", ""]
    lo = secs.get("lora", {})
    if lo.get("cases"):
        L += ["## LoRA cohort against a peft loop", "", _cap(lo.get("job", "")), "",
              "| case | status | s/round | loop / lfed | client 0 max abs diff vs loop | peak memory |", "| --- | --- | --- | --- | --- | --- |"]
        for c in lo["cases"]:
            mem = f"{c['peak_cuda_mb']:.0f} MB (device)" if "peak_cuda_mb" in c else (
                f"{c['peak_rss_mb']:.0f} MB (RSS, whole process)" if "peak_rss_mb" in c else "-")
            L.append(f"| {c['name']} | {_status(c)} | {_f(c.get('steady_s_per_round'))} | {_f(c.get('loop_over_lfed'), 3)} | "
                     f"{_f(c.get('client0_max_abs_diff_vs_loop'), 3)} | {mem} |")
        L.append("")
    pe = secs.get("personal_eval", {})
    if pe.get("cases"):
        L += ["## Personalized evaluation of every client against a per-client loop", "", _cap(pe.get("job", "")), "",
              "| case | status | vmapped s | loop s | loop / vmapped | client state | accuracies equal (else: clients differing, each at a float32 near tie) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
        L += [f"| {c['name']} | {_status(c)} | {_f(c.get('vmapped_s'))} | {_f(c.get('loop_s'))} | {_f(c.get('loop_over_vmapped'), 3)} | "
              f"{_f(c.get('client_state'))} | "
              f"{'yes' if c.get('accuracies_equal') else _f(c.get('clients_differing_by_near_ties'))} |" for c in pe["cases"]]
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


SECTIONS = ("correctness", "setup", "host_sync", "timing", "profile", "compile_graphs", "precision", "lora",
            "personal_eval", "resnet", "dp_sgd")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CPU CI)")
    ap.add_argument("--out", required=True, help="output folder (gpu_suite.json, gpu_suite.md)")
    ap.add_argument("--budget-s", type=float, default=None, help="whole-run time budget (default 480 s; --quick 120 s)")
    ap.add_argument("--case-cap-s", type=float, default=None, help="stop timing a case after this many timed seconds "
                    "(at least 3 timed rounds; default 20 s)")
    ap.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; --quick aot_eager)")
    ap.add_argument("--sections", type=lambda v: [x.strip() for x in v.split(",") if x.strip()], default=None,
                    help="only these sections, comma-separated (environment always runs): " + ", ".join(SECTIONS))
    ap.add_argument("--cohorts", type=lambda v: [int(x) for x in v.split(",")], default=None,
                    help="the timing section's cohorts, comma-separated (default 50,200,1000; --quick 2,4)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.sections or []) - set(SECTIONS))
    if unknown:
        ap.error(f"--sections: {', '.join(unknown)} not among {', '.join(SECTIONS)}")
    if args.budget_s is None:
        args.budget_s = 120.0 if args.quick else 480.0
    if args.case_cap_s is None:
        args.case_cap_s = 20.0
    from lfed.lightning.reporting import silence_library_noise

    silence_library_noise()
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    from lfed.core.registry import CompositionWarning

    warnings.filterwarnings("ignore", category=CompositionWarning)  # short test runs (few participations) are meant
    return Suite(args).run()


if __name__ == "__main__":
    sys.exit(main())
