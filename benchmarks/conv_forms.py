"""The vmap backend's two forms of a cohort's convolutions on this machine (lfed.engine.conv).

    python benchmarks/conv_forms.py                       # SmallCNN 8x8 and PflCNN 16x16, K = 50, B = 20
    python benchmarks/conv_forms.py --repeats 5 --steps 10
    python benchmarks/conv_forms.py --device cuda --clients 50 200 1000 --image-size 32   # on a GPU: the cohort rule's data

Times ``CohortTrainer.train`` of one cohort (K clients, ``--steps`` local steps of batch B, the recorded step
replayed after a warm-up call) with the convolutions forced to ``native`` (torch's grouped convolution) and
to ``matmul`` (unfold + one batched matmul), the two forms alternated ``--repeats`` times (:mod:`harness`); before
every timed call it waits for a quiet machine and prints the 1-minute load beside the time.
Prints the median seconds per call of each form and their ratio matmul / native.
"""

from __future__ import annotations

import harness
import torch
from gpu_suite import PflCNN

from lfed.engine import CohortTrainer, StepRule
from lfed.models.zoo import SmallCNN


def cohort_call(net, shape, K: int, B: int, steps: int, form: str, device: torch.device | None = None):
    """One ``train`` call of a K-client cohort in ``form`` (the data and weights on ``device``)."""
    device = device or torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    n = B * steps
    X = torch.randn(K * n, *shape, generator=g).to(device)
    Y = torch.randint(0, 10, (K * n,), generator=g).to(device)
    idx = torch.arange(K * n, device=device).view(K, n)
    net = net.to(device)
    trainer = CohortTrainer(net, backend="vmap")
    trainer.conv_form = form
    w0 = trainer.layout.module_vector(net)

    def call() -> None:
        trainer.train(w0, X, Y, idx, torch.full((K,), n, device=device), torch.full((K,), steps, device=device),
                      StepRule(), 0.05, B, torch.Generator().manual_seed(1))

    return call


def main() -> None:
    ap = harness.parser(__doc__, repeats=3)
    ap.add_argument("--clients", type=int, nargs="+", default=[50], help="cohort sizes K, each timed in turn")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--image-size", type=int, default=16, help="PflCNN's image side (32: CIFAR's)")
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    if a.quick:
        a.clients, a.image_size, a.steps, a.repeats = [2], 8, 1, 1
    torch.manual_seed(0)
    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    s = a.image_size
    nets = {"SmallCNN 8x8": (SmallCNN(), (1, 8, 8)), f"PflCNN {s}x{s}": (PflCNN(image_size=s, dropout=False), (3, s, s))}
    name_dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name_dev}, torch {torch.__version__}, threads {torch.get_num_threads()}, K = {a.clients}, B = {a.batch}, "
          f"{a.steps} steps a call")
    print("| net | K | form | s per call (median) | runs (s @ load) | matmul / native |")
    print("|---|---|---|---|---|---|")
    for (name, (net, shape)), K in ((n, K) for n in nets.items() for K in a.clients):
        calls = {form: cohort_call(net, shape, K, a.batch, a.steps, form, device) for form in ("native", "matmul")}
        # the first call of each records the step (warm-up); then the forms alternate
        runs = harness.interleave(calls, repeats=a.repeats, warmup=1, sync=sync)
        for form, t in runs.items():
            ratio = f"{t.median / runs['native'].median:.3f}" if form == "matmul" else ""
            print(f"| {name} | {K} | {form} | {t.median:.4f} | {t.runs()} | {ratio} |", flush=True)
        del calls
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
