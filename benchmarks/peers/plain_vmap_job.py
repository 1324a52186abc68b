"""Job 2 written by hand with ``torch.func.vmap``: the reference for lfed's ``vmap`` backend.

The same job as ``plain_loop_job.py`` (FedAvg, MNIST, lfed's 100 shard clients, 10 per round,
E = 1, B = 10, lr 0.05, the 2NN), but the cohort's 10 clients take each local step together:
their weights are stacked ``[K, ...]`` and one ``vmap(grad(loss))`` call gives every client's
mini-batch gradient. Every client here has the same number of examples (600: 60 steps per epoch),
so no masking is needed; that is the simplest vmapped FedAvg a person would write, with nothing a
framework adds (no Lightning, no checks, no logging).

    python benchmarks/peers/plain_vmap_job.py --data /tmp/lfed_peers --rounds 50
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import MLP, harness, load_arrays, plain_job_args, report, test_accuracy  # noqa: E402
from torch.func import functional_call, grad, vmap  # noqa: E402


def main() -> None:
    args = plain_job_args(__doc__)

    a = load_arrays(args.data)
    x, y = torch.from_numpy(a["train_x"]), torch.from_numpy(a["train_y"])
    part = torch.from_numpy(a["partition"])
    n = part.shape[1]
    if args.batch_size <= 0 or n % args.batch_size:
        raise ValueError(f"--batch-size: must divide every client's {n} examples, got {args.batch_size}")
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    model = MLP()
    names = [name for name, _ in model.named_parameters()]
    glob = {name: p.detach().clone() for name, p in model.named_parameters()}

    def loss(params, xb, yb):
        return F.cross_entropy(functional_call(model, params, (xb,)), yb)

    step_grad = vmap(grad(loss))
    marks = [harness.clock()]
    for _ in range(args.rounds):
        cohort = torch.randperm(part.shape[0], generator=g)[: args.per_round]
        idx = part[cohort]  # [K, n]
        w = {name: glob[name].expand(len(cohort), *glob[name].shape).clone() for name in names}
        for _ in range(args.epochs):
            order = torch.argsort(torch.rand(idx.shape, generator=g), dim=1)
            shuffled = torch.gather(idx, 1, order)
            for lo in range(0, n, args.batch_size):
                b = shuffled[:, lo : lo + args.batch_size]  # [K, B]
                grads = step_grad(w, x[b], y[b])
                for name in names:
                    w[name].sub_(grads[name], alpha=args.lr)
        glob = {name: w[name].mean(0) for name in names}  # equal sizes: size weights are uniform
        marks.append(harness.clock())
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(glob[name])
    acc = test_accuracy(model, torch.from_numpy(a["test_x"]), torch.from_numpy(a["test_y"]))
    report("plain_vmap", T_START, marks, acc)


if __name__ == "__main__":
    main()
