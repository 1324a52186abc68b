"""The vmap backend's two forms of a cohort's convolutions on this machine (lfed.engine.conv).

    python benchmarks/conv_forms.py                       # SmallCNN 8x8 and PflCNN 16x16, K = 50, B = 20
    python benchmarks/conv_forms.py --repeats 5 --steps 10

Times ``CohortTrainer.train`` of one cohort (K clients, ``--steps`` local steps of batch B, the recorded step
replayed after a warm-up call) with the convolutions forced to ``native`` (torch's grouped convolution) and
to ``matmul`` (unfold + one batched matmul), the two forms alternated ``--repeats`` times; before every timed
call it waits for a quiet machine (``benchmarks/quiet.py``) and prints the 1-minute load beside the time.
Prints the median seconds per call of each form and their ratio matmul / native.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from lfed.engine import CohortTrainer, StepRule
from lfed.models import SmallCNN

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_suite import PflCNN  # noqa: E402
from quiet import wait_quiet  # noqa: E402


def cohort_call(net, shape, K: int, B: int, steps: int, form: str):
    """``() -> seconds`` of one ``train`` call of a K-client cohort in ``form`` (recorded after a first call)."""
    g = torch.Generator().manual_seed(0)
    n = B * steps
    X = torch.randn(K * n, *shape, generator=g)
    Y = torch.randint(0, 10, (K * n,), generator=g)
    idx = torch.arange(K * n).view(K, n)
    trainer = CohortTrainer(net, backend="vmap")
    trainer.conv_form = form
    w0 = trainer.layout.module_vector(net)

    def call() -> float:
        start = time.perf_counter()
        trainer.train(w0, X, Y, idx, torch.full((K,), n), torch.full((K,), steps), StepRule(), 0.05, B,
                      torch.Generator().manual_seed(1))
        return time.perf_counter() - start

    call()  # records the step
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    nets = {"SmallCNN 8x8": (SmallCNN(), (1, 8, 8)), "PflCNN 16x16": (PflCNN(image_size=16, dropout=False), (3, 16, 16))}
    print(f"torch threads {torch.get_num_threads()}, K = {a.clients}, B = {a.batch}, {a.steps} steps a call")
    print("| net | form | s per call (median) | runs (s @ load) | matmul / native |")
    print("|---|---|---|---|---|")
    for name, (net, shape) in nets.items():
        calls = {form: cohort_call(net, shape, a.clients, a.batch, a.steps, form) for form in ("native", "matmul")}
        runs: dict[str, list[tuple[float, float]]] = {form: [] for form in calls}
        for _ in range(a.repeats):
            for form, call in calls.items():  # alternated
                load, _ = wait_quiet()
                runs[form].append((call(), load))
        med = {form: statistics.median(s for s, _ in r) for form, r in runs.items()}
        for form, r in runs.items():
            shown = ", ".join(f"{s:.3f} @ {load:.2f}" for s, load in r)
            ratio = f"{med['matmul'] / med['native']:.3f}" if form == "matmul" else ""
            print(f"| {name} | {form} | {med[form]:.3f} | {shown} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
