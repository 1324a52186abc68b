"""The vmap backend's two forms of a cohort's convolutions on this machine (lfed.engine.conv).

    python benchmarks/conv_forms.py                       # SmallCNN 8x8 and PflCNN 16x16, K = 50, B = 20
    python benchmarks/conv_forms.py --repeats 5 --steps 10
    python benchmarks/conv_forms.py --device cuda --clients 50 200 1000 --image-size 32   # on a GPU: the cohort rule's data

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
from lfed.models.zoo import SmallCNN

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_suite import PflCNN  # noqa: E402
from quiet import wait_quiet  # noqa: E402


def cohort_call(net, shape, K: int, B: int, steps: int, form: str, device: torch.device = torch.device("cpu")):
    """``() -> seconds`` of one ``train`` call of a K-client cohort in ``form`` (recorded after a first call);
    on CUDA synchronized before and after, the data and weights on the device."""
    g = torch.Generator().manual_seed(0)
    n = B * steps
    X = torch.randn(K * n, *shape, generator=g).to(device)
    Y = torch.randint(0, 10, (K * n,), generator=g).to(device)
    idx = torch.arange(K * n, device=device).view(K, n)
    net = net.to(device)
    trainer = CohortTrainer(net, backend="vmap")
    trainer.conv_form = form
    w0 = trainer.layout.module_vector(net)
    cuda = device.type == "cuda"

    def call() -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.train(w0, X, Y, idx, torch.full((K,), n, device=device), torch.full((K,), steps, device=device),
                      StepRule(), 0.05, B, torch.Generator().manual_seed(1))
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    call()  # records the step
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[50], help="cohort sizes K, each timed in turn")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--image-size", type=int, default=16, help="PflCNN's image side (32: CIFAR's)")
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    device = torch.device(a.device)
    s = a.image_size
    nets = {"SmallCNN 8x8": (SmallCNN(), (1, 8, 8)), f"PflCNN {s}x{s}": (PflCNN(image_size=s, dropout=False), (3, s, s))}
    name_dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name_dev}, torch {torch.__version__}, threads {torch.get_num_threads()}, K = {a.clients}, B = {a.batch}, "
          f"{a.steps} steps a call")
    print("| net | K | form | s per call (median) | runs (s @ load) | matmul / native |")
    print("|---|---|---|---|---|---|")
    for (name, (net, shape)), K in ((n, K) for n in nets.items() for K in a.clients):
        calls = {form: cohort_call(net, shape, K, a.batch, a.steps, form, device) for form in ("native", "matmul")}
        runs: dict[str, list[tuple[float, float]]] = {form: [] for form in calls}
        for _ in range(a.repeats):
            for form, call in calls.items():  # alternated
                load, _ = wait_quiet()
                runs[form].append((call(), load))
        med = {form: statistics.median(s for s, _ in r) for form, r in runs.items()}
        for form, r in runs.items():
            shown = ", ".join(f"{s:.3f} @ {load:.2f}" for s, load in r)
            ratio = f"{med['matmul'] / med['native']:.3f}" if form == "matmul" else ""
            print(f"| {name} | {K} | {form} | {med[form]:.4f} | {shown} | {ratio} |", flush=True)
        del calls
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
