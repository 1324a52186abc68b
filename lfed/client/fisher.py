"""EFL's Fisher reports (docs/algorithms.md §2 efl): the empirical Fisher diagonal of each client, split over ranks.

``diag(F_k) = mean_i (∂ loss(x_i) / ∂ w)²`` at client k's final weights, over
``min(n_k, num_samples)`` of its examples drawn without replacement (per-example gradients,
never squared batch gradients). Only :class:`~lfed.client.objectives.EFL` uses it; the engine
and the round know nothing of it. :func:`fisher_cohort` splits the clients over the ranks like
local training (:mod:`lfed.engine.ranks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import partial

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from lfed.engine import CohortTrainer
from lfed.engine.ranks import Ranks, assign_rows, gather_rows

__all__ = ["FisherJob", "fisher_cohort", "fisher_diagonal", "fisher_share"]


def _example_loss(engine: CohortTrainer, flat: Tensor, x: Tensor, y: Tensor, buffers: dict[str, Tensor]) -> Tensor:
    out = functional_call(engine.net, (engine.layout.unflatten(flat), buffers), (x[None],))
    return engine.loss_fn(out, y[None]).sum()


def fisher_diagonal(
    engine: CohortTrainer,
    weights: Tensor,
    data_x: Tensor,
    data_y: Tensor,
    index: Tensor,
    num_examples: Tensor,
    num_samples: int,
    generator: torch.Generator,
    max_elements: int = 2**26,
    rows: Tensor | None = None,
) -> Tensor:
    """Empirical Fisher diagonal of each client at its own weights (EFL, docs/algorithms.md §2 efl).

    ``diag(F_k) = mean_i (∂ loss(x_i) / ∂ w)²`` over ``min(n_k, num_samples)`` of client
    k's examples drawn without replacement: squared per-example gradients, never
    squared batch gradients.

    Args:
        engine: The cohort trainer of the model (its net, loss and backend).
        weights: ``[K, P]`` client weights (``w_end``).
        num_samples: Examples per client (>= 1).
        max_elements: Bound on ``K * chunk * P`` per-example gradient entries held at once.
        rows: Only these rows (``[K_r]`` indices; None: all K). The examples are still drawn
            for all K, so a row's diagonal is the one it has beside the others
            (:func:`fisher_cohort` splits the Fisher reports over ranks so).

    Returns:
        ``[K, P]`` Fisher diagonals (``[K_r, P]`` with ``rows``).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples: must be >= 1, got {num_samples}")
    K, P = weights.shape
    n = num_examples.detach().cpu().long()
    max_n = max(n.tolist(), default=0)  # the round gives the host sizes (lfed.engine.host)
    S = min(int(num_samples), max_n)
    keys = torch.rand(K, max_n, generator=generator, dtype=torch.float64)
    keys.masked_fill_(torch.arange(max_n) >= n[:, None], math.inf)
    pos = keys.argsort(dim=1)[:, :S].to(index.device, non_blocking=True)
    count = torch.minimum(n, torch.tensor(S)).to(weights.device, weights.dtype, non_blocking=True)
    valid = (torch.arange(S)[None, :] < n[:, None].clamp(max=S)).to(weights.device, weights.dtype)
    idx = index.gather(1, pos)
    if rows is not None:
        at = rows.to(weights.device)
        weights, idx, count, valid = weights[at], idx[at.to(idx.device)], count[at], valid[at]
    buffers = {n: b.clone() for n, b in engine.net.named_buffers()}  # running stats must not move
    total = torch.zeros_like(weights)
    example_loss = partial(_example_loss, engine)
    if engine.resolve_backend(data_x, data_y) == "vmap":
        per_example = vmap(
            vmap(grad(example_loss), in_dims=(None, 0, 0, None), randomness="different"),
            in_dims=(0, 0, 0, None),
            randomness="different",
        )
        chunk = max(1, min(S, max_elements // max(K * P, 1)))
        for lo in range(0, S, chunk):
            sl = slice(lo, min(lo + chunk, S))
            g = per_example(weights, data_x[idx[:, sl]], data_y[idx[:, sl]], buffers)  # [K, c, P]
            total += (g.square() * valid[:, sl, None]).sum(1)
    else:
        for k in range(weights.shape[0]):
            for i in range(int(count[k])):
                leaf = weights[k].detach().clone().requires_grad_(True)  # own memory: bits do not depend on the row's place
                loss = example_loss(leaf, data_x[idx[k, i]], data_y[idx[k, i]], buffers)
                (g,) = torch.autograd.grad(loss, leaf)
                total[k] += g.square()
    return total / count[:, None]


@dataclass(frozen=True)
class FisherJob:
    """The Fisher reports of a cohort: the arguments of :func:`fisher_diagonal` after ``engine``, in its order."""

    weights: Tensor
    data_x: Tensor
    data_y: Tensor
    index: Tensor
    num_examples: Tensor
    num_samples: int
    generator: torch.Generator

    def args(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))


def fisher_share(engine: CohortTrainer, ranks: Ranks, job: FisherJob) -> tuple[list[Tensor], Tensor]:
    """This rank's part of the Fisher reports: every rank's rows (by ``min(n_k, num_samples)``) and its own diagonals."""
    parts = assign_rows(job.num_examples.detach().cpu().long().clamp(max=int(job.num_samples)), ranks.world_size)
    mine = parts[ranks.rank]
    if not mine.numel():
        return parts, job.weights.new_zeros(0, job.weights.shape[1])
    return parts, fisher_diagonal(engine, *job.args(), rows=mine)


def fisher_cohort(engine: CohortTrainer, ranks: Ranks, job: FisherJob) -> Tensor:
    """:func:`fisher_diagonal` of K clients, split over the ranks (EFL reports).

    With one process this is ``fisher_diagonal(engine, ...)`` itself; with W processes each rank
    computes its rows (:func:`fisher_share`) from the same example draws and the ``[K, P]``
    diagonals are all-gathered.
    """
    if not ranks.distributed:
        return fisher_diagonal(engine, *job.args())
    parts, local = fisher_share(engine, ranks, job)
    return gather_rows(ranks, local, parts)
