"""What the GPU suite's sections share: the pfl CNN, the sizes (full or --quick), the device helpers, the table cells."""

from __future__ import annotations

import contextlib
import math
import os
import resource
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
for _path in (REPO, BENCH):  # lfed from this checkout (the GPU machine has no lfed installed); the harness, the benchmarks
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

#: pfl-research's published A100 time for this job: not documented anywhere in this repository.
PFL_A100_NOTE = ("pfl-research's published A100 time for this job: PLACEHOLDER, not documented in this repository "
                 "(look it up in pfl-research's paper/benchmarks before comparing; no number is invented here)")

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
