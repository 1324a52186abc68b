"""A cohort's local training with ResNet-20 on the CPU: lfed's vmap backend against its loop backend and the
centralized step over the same examples (issue 53).

    python benchmarks/resnet_round.py --cohorts 5 10 --width 8 --repeats 3

ResNet-20 (``lfed.models.ResNet20``; He et al. 2016) with BatchNorm (each client's running statistics its own row
under vmap) or GroupNorm, on ``cifar_synthetic`` (3x32x32), ``K`` clients of 64 examples, 5 local steps of batch 32,
with and without ``crop_flip`` augmentation. One timed call of :meth:`lfed.engine.CohortTrainer.train` per
variant, after a warm-up call of each; "centralized" is one ResNet-20 taking the same 5 steps over the cohort's
``K x 32`` examples at once (plain autograd, torch's BatchNorm: the same examples and FLOPs in one batch). Every
repeat times every variant once, in turn (interleaved), waiting for a quiet machine before each
(:mod:`harness`); the table gives medians, the ratio to the centralized step, and the loads seen.
Not part of the test suite.
"""

from __future__ import annotations

import os

import harness
import torch

from lfed.data.augment import build_augmentation
from lfed.data.datasets import load_dataset
from lfed.engine import CohortTrainer, StepRule
from lfed.models import ResNet20

STEPS, BATCH, PER_CLIENT = 5, 32, 64


def cohort(k: int, x: torch.Tensor):
    index = torch.arange(k * PER_CLIENT).view(k, PER_CLIENT) % x.shape[0]
    return index, torch.full((k,), PER_CLIENT)


def lfed_call(net, backend: str, x, y, index, sizes, steps: int = STEPS, batch: int = BATCH, augment: bool = False):
    """One ``CohortTrainer.train`` of the cohort ``index`` (``[K, n]``), ``steps`` of ``batch`` (also gpu_suite's)."""
    engine = CohortTrainer(net, backend=backend)
    w0 = engine.layout.module_vector(net)
    aug = build_augmentation("crop_flip") if augment else None
    k = index.shape[0]

    def call():
        extra = {} if aug is None else {"augment": (aug, torch.Generator().manual_seed(1))}
        engine.train(w0, x, y, index, sizes, torch.full((k,), steps), StepRule(), 0.05, batch,
                     torch.Generator().manual_seed(0), **extra)

    return call


def centralized_call(net, x, y, index, steps: int = STEPS, batch: int = BATCH):
    """One net taking the same ``steps`` over the cohort's ``K x batch`` examples at once (also gpu_suite's)."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    n = index.shape[1]

    def call():
        for t in range(steps):
            ids = index[:, (t * batch) % n:][:, :batch].reshape(-1)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[ids]), y[ids]).backward()
            opt.step()

    return call


def main() -> None:
    p = harness.parser(__doc__, repeats=3, description=__doc__.splitlines()[0])
    p.add_argument("--cohorts", type=int, nargs="+", default=[5, 10])
    p.add_argument("--width", type=int, default=8)
    args = p.parse_args()
    if args.quick:
        args.cohorts, args.width, args.repeats = [1], 2, 1
    data = load_dataset("cifar_synthetic")
    x, y = data.train_x, data.train_y
    rows = []
    for k in args.cohorts:
        variants = {}
        index, sizes = cohort(k, x)
        for norm in ("batch", "group"):
            def make(norm=norm):
                torch.manual_seed(0)
                return ResNet20(width=args.width, norm=norm)
            net = make()
            variants[f"lfed vmap, {norm}"] = lfed_call(net, "vmap", x, y, index, sizes)
            variants[f"lfed loop, {norm}"] = lfed_call(net, "loop", x, y, index, sizes)
            variants[f"centralized, {norm}"] = centralized_call(make(), x, y, index)
        variants["lfed vmap, batch, crop_flip"] = lfed_call(ResNet20(width=args.width), "vmap", x, y, index, sizes, augment=True)
        # warm-up (recording the step, allocator), then every variant once per repeat, in turn
        times = harness.interleave(variants, repeats=args.repeats, warmup=1)
        loads = harness.all_loads(times.values())
        med = {name: t.median for name, t in times.items()}
        for name, m in med.items():
            ref = med["centralized, " + ("group" if "group" in name else "batch")]
            rows.append((k, name, m, m / ref, min(loads), max(loads)))
            print(f"K={k:4d}  {name:28s} {m:8.3f} s  {m / ref:5.2f}x centralized  (load {min(loads):.2f}-{max(loads):.2f})",
                  flush=True)
    print("\n| K | variant | s per call (median) | vs centralized | 1-min load |")
    print("|---|---|---|---|---|")
    for k, name, m, r, lo, hi in rows:
        print(f"| {k} | {name} | {m:.3f} | {r:.2f}x | {lo:.2f}-{hi:.2f} |")
    print(f"\nResNet-20 width {args.width}, {STEPS} steps of batch {BATCH}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
