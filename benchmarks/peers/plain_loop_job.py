"""Job 2 written by hand as a plain PyTorch per-client loop: the reference for lfed's ``loop`` backend.

FedAvg on MNIST, lfed's 100 shard clients (``partition.npy``), 10 per round drawn uniformly without
replacement, E = 1, B = 10, client lr 0.05, server lr 1, the 2NN. One model object; each client
loads the global weights, runs ``torch.optim.SGD`` over its reshuffled examples, and the server
averages the returned weights by example count. No framework, no Lightning: the least a Python
loop over clients can cost.

    python benchmarks/peers/plain_loop_job.py --data /tmp/lfed_peers --rounds 50
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import MLP, harness, load_arrays, local_sgd, plain_job_args, report, test_accuracy  # noqa: E402


def main() -> None:
    args = plain_job_args(__doc__)

    a = load_arrays(args.data)
    x, y = torch.from_numpy(a["train_x"]), torch.from_numpy(a["train_y"])
    part = torch.from_numpy(a["partition"])
    clients = [(x[idx], y[idx]) for idx in part]
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    model = MLP()
    glob = [p.detach().clone() for p in model.parameters()]
    marks = [harness.clock()]
    for _ in range(args.rounds):
        cohort = torch.randperm(len(clients), generator=g)[: args.per_round].tolist()
        acc = [torch.zeros_like(w) for w in glob]
        total = 0
        for k in cohort:
            with torch.no_grad():
                for p, w in zip(model.parameters(), glob):
                    p.copy_(w)
            cx, cy = clients[k]
            local_sgd(model, cx, cy, args.lr, args.epochs, args.batch_size, g)
            n = cx.shape[0]
            total += n
            with torch.no_grad():
                for s, p in zip(acc, model.parameters()):
                    s.add_(p, alpha=n)
        glob = [s / total for s in acc]
        marks.append(harness.clock())
    with torch.no_grad():
        for p, w in zip(model.parameters(), glob):
            p.copy_(w)
    acc = test_accuracy(model, torch.from_numpy(a["test_x"]), torch.from_numpy(a["test_y"]))
    report("plain_loop", T_START, marks, acc)


if __name__ == "__main__":
    main()
