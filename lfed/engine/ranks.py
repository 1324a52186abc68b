"""Several processes, GPUs and nodes through Lightning's DDP (docs/distributed.md).

lfed runs on Lightning's distributed strategies (``--trainer.strategy ddp --trainer.devices N
--trainer.num_nodes M``); it has no transport of its own. The collectives below run on the
default process group that Lightning's strategy set up (NCCL on GPUs, Gloo on CPUs).

**Replicated state.** Every rank holds the global model, the server optimizer and every
per-client tensor (SCAFFOLD ``c_k``, IGFL previous updates, EFL reports, residuals, AdaFL scores),
exactly as one process does; so the memory of the client state per rank is that of one process
and does not grow (or shrink) with the number of processes, a checkpoint written by rank 0 holds
the whole run, and it resumes on any number of processes.

**A round on W ranks.** All ranks draw the same cohort, stragglers and batch schedule (every draw
comes from :func:`lfed.rng.round_generator` ``(seed, round, stream)``). :func:`assign_rows` splits
the cohort's rows over the ranks, balanced by local work (steps done x batch); each rank trains its
rows with :meth:`~lfed.engine.CohortTrainer.train` ``(rows=...)``, which keeps the batch schedule of
the whole cohort, so a client trains exactly as it would in one process. The final client weights
``[K_r, P]`` and losses are all-gathered (padded to equal size) so that every rank holds all K
results and runs the identical server step: weighted means, IGFL attention, DWFed weights, AdaFL
distances, SCAFFOLD/EFL state updates, compression residuals. EFL's Fisher reports are split and
gathered the same way (:func:`lfed.client.fisher.fisher_cohort`). The all-gather moves ``K x P`` numbers per rank per
round (the uploads of the cohort), which is what the server of a real deployment receives.

**Evaluation** is split too: the test set by the datamodule's unpadded sampler, client-side
accuracy by example ranges (:meth:`Ranks.share`); the sums (loss, correct, count) are all-reduced
(:func:`sum_over_ranks`), so each item counts exactly once.

With one process every helper calls the engine exactly as before: no collective, no copy.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lfed.engine import CohortResult, CohortTrainer, has_running_stats
from lfed.engine.job import TrainJob
from lfed.state.fingerprint import tensor_bytes

__all__ = [
    "Ranks",
    "assemble_rows",
    "assign_rows",
    "check_digests",
    "cohort_parts",
    "gather_rows",
    "pad_rows",
    "state_digest",
    "sum_over_ranks",
    "train_cohort",
    "train_share",
]


# torch >= 2.13 names it all_gather_single; all_gather_into_tensor before (same semantics)
_all_gather_single = getattr(torch.distributed, "all_gather_single", None) or getattr(
    torch.distributed, "all_gather_into_tensor", None
)


@dataclass(frozen=True)
class Ranks:
    """The processes of a run, as the round sees them.

    Attributes:
        rank: This process's global rank.
        world_size: Number of processes ``W`` (``devices x num_nodes``).
    """

    rank: int = 0
    world_size: int = 1

    @classmethod
    def of(cls, module: Any) -> Ranks:
        """The ranks of ``module``'s trainer (one process when it has no trainer)."""
        trainer = getattr(module, "_trainer", None)
        world = int(getattr(trainer, "world_size", 1) or 1) if trainer is not None else 1
        if world <= 1:
            return cls()
        return cls(int(trainer.global_rank), world)

    @property
    def distributed(self) -> bool:
        """Whether there is more than one process."""
        return self.world_size > 1

    def all_gather(self, x: Tensor) -> Tensor:
        """``[W, *x.shape]``: ``x`` of every rank (same shape on every rank), in rank order."""
        if not self.distributed:
            return x[None]
        flat = x.contiguous().reshape(-1)
        out = flat.new_empty(self.world_size * flat.numel())
        _all_gather_single(out, flat)
        return out.view(self.world_size, *x.shape)

    def all_reduce_sum(self, x: Tensor) -> Tensor:
        """The sum of ``x`` over all ranks (``x`` itself with one process)."""
        if not self.distributed:
            return x
        x = x.clone()
        torch.distributed.all_reduce(x)
        return x

    def share(self, n: int) -> tuple[int, int]:
        """This rank's contiguous share ``[lo, hi)`` of ``n`` items (sizes differ by at most one)."""
        lo = (n * self.rank) // self.world_size
        return lo, (n * (self.rank + 1)) // self.world_size


def assign_rows(work: Tensor, world_size: int) -> list[Tensor]:
    """Split the rows of a cohort over ranks, balanced by work (greedy longest-first).

    Rows are taken by decreasing work (ties: lower row first) and each goes to the rank with the
    least work so far (ties: lower rank). The result depends on ``work`` alone, so every rank
    computes the same assignment without communicating.

    Args:
        work: ``[K]`` non-negative work per row (lfed uses steps done x examples per step).
        world_size: Number of ranks ``W >= 1``.

    Returns:
        ``W`` tensors of row indices (ascending; some may be empty when ``K < W``).

    Example:
        >>> [p.tolist() for p in assign_rows(torch.tensor([5, 1, 4, 2, 3]), 2)]
        [[0, 1, 3], [2, 4]]
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: must be an int >= 1, got {world_size!r}")
    work = torch.as_tensor(work).detach().cpu()
    if work.dim() != 1:
        raise ValueError(f"work: expected a [K] tensor, got shape {tuple(work.shape)}")
    if bool((work < 0).any()):
        raise ValueError(f"work: must be >= 0 for every row, got {work.tolist()}")
    order = sorted(range(work.numel()), key=lambda i: (-float(work[i]), i))
    load = [0.0] * world_size
    rows: list[list[int]] = [[] for _ in range(world_size)]
    for i in order:
        r = min(range(world_size), key=lambda j: (load[j], j))
        rows[r].append(i)
        load[r] += float(work[i])
    return [torch.tensor(sorted(r), dtype=torch.long) for r in rows]


def pad_rows(local: Tensor, parts: list[Tensor], rank: int) -> Tensor:
    """Rank ``rank``'s rows ``local`` zero-padded to the largest share (all-gather needs one shape)."""
    mine = parts[rank]
    if local.shape[0] != mine.numel():
        raise ValueError(f"local: rank {rank} has {mine.numel()} rows, got a tensor of {local.shape[0]}")
    padded = local.new_zeros((max(int(p.numel()) for p in parts), *local.shape[1:]))
    padded[: local.shape[0]] = local
    return padded


def assemble_rows(gathered: Tensor, parts: list[Tensor]) -> Tensor:
    """``[K, ...]`` from the gathered padded shares ``[W, max_share, ...]``: row ``parts[r][i]`` is ``gathered[r, i]``."""
    out = gathered.new_empty((sum(int(p.numel()) for p in parts), *gathered.shape[2:]))
    for r, rows in enumerate(parts):
        if rows.numel():
            out[rows.to(out.device)] = gathered[r, : rows.numel()]
    return out


def gather_rows(ranks: Ranks, local: Tensor, parts: list[Tensor]) -> Tensor:
    """Rows computed on different ranks, assembled on every rank (bit for bit).

    Args:
        ranks: The processes.
        local: ``[len(parts[rank]), ...]`` this rank's rows.
        parts: Row indices of every rank (:func:`assign_rows`); they partition ``range(K)``.

    Returns:
        ``[K, ...]``, row ``parts[r][i]`` taken from rank r's ``local[i]``.
    """
    return assemble_rows(ranks.all_gather(pad_rows(local, parts, ranks.rank)), parts)


def cohort_parts(num_examples: Tensor, steps_done: Tensor, batch_size: int | None, world_size: int) -> list[Tensor]:
    """The rows of a cohort each rank trains: :func:`assign_rows` by steps done x ``min(B, n_k)``."""
    per_step = num_examples if batch_size is None else num_examples.clamp(max=batch_size)
    return assign_rows(steps_done.detach().cpu().long() * per_step.detach().cpu().long(), world_size)




def train_share(engine: CohortTrainer, ranks: Ranks, job: TrainJob) -> tuple[list[Tensor], CohortResult]:
    """This rank's part of a cohort's local training: every rank's rows, and the result of its own.

    No communication: :func:`train_cohort` gathers the shares. A rank with no rows (fewer clients
    than ranks) returns an empty result.
    """
    parts = cohort_parts(job.sizes_on_host(), job.steps_on_host(), job.batch_size, ranks.world_size)
    mine = parts[ranks.rank]
    if mine.numel():
        return parts, job.train(engine, rows=mine)
    buffers = None
    if has_running_stats(engine.net):  # either backend returns every buffer per client
        buffers = {n: b.new_zeros((0, *b.shape)) for n, b in engine.net.named_buffers()}
    w_start = job.w_start
    return parts, CohortResult(w_start.new_zeros(0, w_start.shape[-1]), w_start.new_zeros(0), buffers)


def train_cohort(engine: CohortTrainer, ranks: Ranks, job: TrainJob) -> CohortResult:
    """:meth:`CohortTrainer.train` of a whole cohort, split over the ranks.

    With one process this is ``engine.train(*job.args())`` itself. With W processes each rank trains
    the rows :func:`cohort_parts` gives it and the final weights and losses of all rows are
    all-gathered, so every rank returns the result of the whole cohort: the one-process result,
    up to the round-off of running fewer clients per vmap call (bit for bit in lfed's tests;
    docs/distributed.md).
    """
    if not ranks.distributed:
        return job.train(engine)
    if job.index.shape[0] == 0:  # an empty cohort (Poisson sampling): every rank knows it, no collective needed
        return job.train(engine)
    parts, local = train_share(engine, ranks, job)
    P = job.w_start.shape[-1]
    packed = gather_rows(ranks, torch.cat([local.weights, local.loss.to(local.weights.dtype)[:, None]], 1), parts)
    buffers = None
    if local.buffers is not None:
        buffers = {name: gather_rows(ranks, b, parts) for name, b in local.buffers.items()}
    return CohortResult(packed[:, :P], packed[:, P].to(local.loss.dtype), buffers)


def sum_over_ranks(parts: list[Tensor], ranks: Ranks, like: Tensor) -> Tensor | None:
    """``sum(parts)`` over this rank's list and all ranks; None when no rank has any part.

    Args:
        parts: This rank's partial sums (e.g. ``[loss, correct, count]`` per evaluation batch).
        ranks: The processes.
        like: A zero tensor of the shape, dtype and device of one part (for a rank with none).
    """
    if not ranks.distributed:
        return torch.stack(parts).sum(0) if parts else None
    local = torch.stack(parts).sum(0) if parts else torch.zeros_like(like)
    flag = like.new_full((1,), float(bool(parts)))  # how many ranks had any part
    total = ranks.all_reduce_sum(torch.cat([local.reshape(-1), flag]))
    return total[:-1].reshape(like.shape) if float(total[-1]) > 0 else None


def state_digest(module: torch.nn.Module, optimizers: list[torch.optim.Optimizer] | None = None) -> int:
    """A 63-bit hash of every byte of ``module``'s state dict and the optimizers' state tensors."""
    h = hashlib.blake2b(digest_size=8)

    def add(name: str, value: Any) -> None:
        h.update(name.encode())
        if isinstance(value, Tensor):
            h.update(str(value.dtype).encode())
            h.update(tensor_bytes(value))
        else:
            h.update(repr(value).encode())

    for name, value in module.state_dict().items():
        add(name, value)
    for i, opt in enumerate(optimizers or []):
        for key, state in sorted(opt.state_dict()["state"].items()):
            for field, value in sorted(state.items()):
                add(f"opt{i}/{key}/{field}", value)
    return int.from_bytes(h.digest(), "big") & ((1 << 63) - 1)


def check_digests(digests: list[int], round: int) -> None:
    """Raise if the state digests of the ranks (in rank order) are not all equal to rank 0's."""
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise RuntimeError(
            f"round {round}: the state of ranks {differ} differs from rank 0's (digests {digests}); "
            "the ranks no longer compute the same run. Use deterministic kernels "
            "(--trainer.deterministic true) and the same software on every node."
        )
