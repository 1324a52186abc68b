"""What the peer jobs of ``benchmarks/peers_mnist.py`` share: the data files, the model, one client's SGD.

The peers run in their own virtual environments (numpy and torch, no lfed), so this file imports
neither lfed nor anything beyond torch and numpy. The data are the files that
``peers_mnist.py`` exported from lfed: MNIST scaled to [0, 1] exactly as lfed loads it, and lfed's
shards partition (``partition.npy``, ``[100, 600]`` example indices), so every framework trains
the same clients on the same examples.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/harness.py: the standard library only, as these environments have)


def plain_job_args(doc: str):
    """Arguments of the hand-written reference jobs (``plain_loop_job.py``, ``plain_vmap_job.py``)."""
    p = harness.parser(doc, quick=False)
    p.add_argument("--data", required=True)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def load_arrays(data: str) -> dict[str, np.ndarray]:
    """``train_x [60000, 784] float32``, ``train_y``, ``test_x``, ``test_y``, ``partition [N, n]``."""
    return {name: np.load(os.path.join(data, f"{name}.npy")) for name in ("train_x", "train_y", "test_x", "test_y", "partition")}


class MLP(nn.Module):
    """McMahan et al.'s 2NN, 784-200-200-10 with ReLU (199,210 parameters), like lfed.models.zoo.MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


def local_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, epochs: int, batch_size: int,
              generator: torch.Generator | None = None) -> float:
    """The standard PyTorch loop on one client's tensors: reshuffle each epoch, batches of B."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    total, steps = 0.0, 0
    for _ in range(epochs):
        perm = torch.randperm(x.shape[0], generator=generator)
        for lo in range(0, x.shape[0], batch_size):
            ids = perm[lo : lo + batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[ids]), y[ids])
            loss.backward()
            opt.step()
            total += float(loss.detach())
            steps += 1
    return total / max(steps, 1)


@torch.no_grad()
def test_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((model(x).argmax(-1) == y).float().mean())


def report(framework: str, t_start: float, marks: list[float], test_acc: float, **extra) -> None:
    """Print the job's ``RESULT`` line (:func:`harness.print_result`): ``marks[0]`` is the start of round 1, ``marks[r]``
    the end of round r (:data:`harness.clock` readings; ``t_start``, the same clock's, read before the job's imports)."""
    t_end = harness.clock()
    rounds = [b - a for a, b in zip(marks[:-1], marks[1:])]
    harness.print_result({
        "framework": framework, "total_s": t_end - t_start, "startup_s": marks[0] - t_start,
        "round_s": rounds, "eval_s": t_end - marks[-1], "test_acc": test_acc,
        "threads": torch.get_num_threads(), "torch": torch.__version__, **extra,
    })
