"""Many runs' cohorts in as few engine calls as is exact: the rows of a lock-step round (docs/grids.md).

The runs of a group (:class:`lfed.lightning.group.RunGroup`) prepare their rounds alone; their cohorts
are then trained together: rows whose step rules can be concatenated exactly
(:func:`rule_signature`) and that share the data, batch plan, backend and loss go into ONE
:meth:`~lfed.engine.CohortTrainer.train` call (per-row start weights, learning rates and batch
schedules, :func:`concat_rules`, :func:`stack_schedules`), split over the ranks like one run's
cohort (:func:`lfed.engine.ranks.train_cohort`). Each row's result is the one it gets trained
alone: bit for bit in float64 on one intra-op thread (with several, MKL may split a batched
product of 180 rows differently from one of 10, so rows agree to round-off, as chunking does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lfed.core.round import train_prepared
from lfed.engine import CohortResult, StepRule, batch_schedule, has_running_stats
from lfed.engine.host import values
from lfed.engine.job import TrainJob
from lfed.engine.ranks import Ranks, train_cohort

__all__ = ["concat_rules", "engine_key", "merge_jobs", "rule_signature", "stack_schedules", "train_together"]


def rule_signature(rule: StepRule, dtype: torch.dtype) -> tuple | None:
    """What must agree for step rules to be concatenated exactly (None: never concatenated).

    ``grad_scale`` may differ (a float becomes a ``[K]`` tensor of the weights' dtype: the same
    single rounding); ``shift`` must be present in all or none; ``decay`` must be absent in all,
    a tensor in all, or the same float in all (a float decay is a fused multiply-add, a tensor
    decay is not, so they round differently). Rules with a loss term, a gradient mask or
    example-level DP-SGD (each row its own noise streams) are not concatenated.
    """
    if rule.loss_term is not None or rule.grad_mask is not None or rule.example_dp is not None:
        return None
    scale = rule.grad_scale
    if isinstance(scale, Tensor) and scale.dtype != dtype:
        return None
    if rule.decay is None:
        decay: tuple = ("none",)
    elif isinstance(rule.decay, Tensor):
        decay = ("tensor", rule.decay.dtype)
    else:
        decay = ("float", float(rule.decay))
    shift = None if rule.shift is None else ("tensor", rule.shift.dtype)
    return decay, shift


def concat_rules(rules: Sequence[StepRule], counts: Sequence[int], num_params: int, like: Tensor) -> StepRule:
    """The step rule of the concatenated rows of several runs (rules of one :func:`rule_signature`).

    Args:
        rules: Each run's rule for its ``counts[i]`` rows.
        counts: Rows of each run.
        num_params: ``P``.
        like: A tensor of the weights' dtype and device.
    """
    sigs = {rule_signature(r, like.dtype) for r in rules}
    if len(sigs) != 1 or None in sigs:
        raise ValueError(f"rules: cannot concatenate step rules of different kinds {sorted(map(str, sigs))}")

    def rows(x: Tensor | None, k: int, per_client_dim: int) -> Tensor:
        if x.dim() == per_client_dim and x.shape[0] == k:
            return x
        return x.expand(k, *x.shape[-(per_client_dim - 1):]) if per_client_dim == 2 else x.expand(k)

    scales = [r.grad_scale for r in rules]
    if all(not isinstance(s, Tensor) and s == 1.0 for s in scales):
        grad_scale: float | Tensor = 1.0
    else:
        grad_scale = torch.cat([
            rows(s, k, 1) if isinstance(s, Tensor) else torch.full((k,), float(s), dtype=like.dtype, device=like.device)
            for s, k in zip(scales, counts)
        ])
    decay = rules[0].decay
    if isinstance(decay, Tensor):
        decay = torch.cat([rows(r.decay, k, 2) for r, k in zip(rules, counts)])
    shift = None
    if rules[0].shift is not None:
        shift = torch.cat([rows(r.shift, k, 2) for r, k in zip(rules, counts)])
    return StepRule(grad_scale=grad_scale, decay=decay, shift=shift)


def stack_schedules(schedules: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Concatenate the batch schedules of several runs (``[K_r, T_r, B']`` each; ``T`` padded, never read)."""
    T = max(p.shape[1] for p, _ in schedules)
    pos = [torch.nn.functional.pad(p, (0, 0, 0, T - p.shape[1])) for p, _ in schedules]
    val = [torch.nn.functional.pad(v, (0, 0, 0, T - v.shape[1])) for _, v in schedules]
    return torch.cat(pos), torch.cat(val)


def _pad_steps(t: Tensor, T: int) -> Tensor:
    """``[K, T_r, ...]`` padded with zeros to ``[K, T, ...]`` (steps a row never takes, never read)."""
    if t.shape[1] == T:
        return t
    return torch.cat([t, t.new_zeros((t.shape[0], T - t.shape[1], *t.shape[2:]))], 1)


def _has_dropout(net: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in net.modules())


def _batch_width(job) -> int:
    """``B'`` of the job's batch schedule (:func:`lfed.engine.batch_schedule`)."""
    max_n = max(values(job.sizes_on_host()), default=0)
    return max_n if job.batch_size is None else min(int(job.batch_size), max_n)


def engine_key(run: Any, job: TrainJob) -> tuple:
    """Runs whose rows have equal keys train in one engine call (``run``: a :class:`~lfed.core.run.FederatedRun`)."""
    net = run.net
    sig = rule_signature(job.rule, job.w_start.dtype)
    # a frozen base (lfed.models.adapters) trains alone: the engine computes with one run's net, and the runs' bases
    # (or FFA-LoRA's frozen A) may differ; and the base's product is one matrix product over all the call's rows,
    # whose rounding depends on how many rows there are
    frozen = any(not p.requires_grad for p in net.parameters())
    alone = sig is None or _has_dropout(net) or has_running_stats(net) or len(dict(net.named_buffers())) or frozen
    return (id(run) if alone else None, sig, job.batch_size, _batch_width(job), id(job.data_x), id(job.data_y), run.backend,
            run.chunk_size, repr(run.loss), None if job.augment is None else repr(job.augment[0]))


def merge_jobs(jobs: Sequence[TrainJob]) -> TrainJob:
    """One job of the rows of several (same data, batch size, rule kind): per-row start weights, rates, schedule."""
    counts = [j.index.shape[0] for j in jobs]
    P = jobs[0].w_start.shape[-1]
    width = max(j.index.shape[1] for j in jobs)
    index = torch.cat([torch.nn.functional.pad(j.index, (0, width - j.index.shape[1])) for j in jobs])
    w0 = torch.cat([j.w_start.expand(k, P) for j, k in zip(jobs, counts)])
    lr = torch.cat([torch.full((k,), float(j.lr), dtype=torch.float64) for j, k in zip(jobs, counts)])
    schedule = stack_schedules([
        batch_schedule(j.sizes_on_host(), max(values(j.steps_on_host()), default=0), j.batch_size, j.generator)
        for j in jobs
    ])
    rule = concat_rules([j.rule for j in jobs], counts, P, w0)
    augment = None
    if jobs[0].augment is not None:  # each run's draws from its own generator, as alone; padded to the call's [T, B']
        aug, image, T = jobs[0].augment[0], tuple(jobs[0].data_x.shape[1:]), schedule[0].shape[1]
        drawn = [aug.draw((k, max(values(j.steps_on_host()), default=0), _batch_width(j)), image, j.augment[1])
                 for j, k in zip(jobs, counts)]
        augment = (aug, {name: torch.cat([_pad_steps(d[name], T) for d in drawn]) for name in drawn[0]})
    return TrainJob(w0, jobs[0].data_x, jobs[0].data_y, index, torch.cat([j.num_examples for j in jobs]),
                    torch.cat([j.steps_done for j in jobs]), rule, lr, jobs[0].batch_size, None, schedule, augment=augment,
                    host_num_examples=torch.cat([j.sizes_on_host() for j in jobs]),
                    host_steps_done=torch.cat([j.steps_on_host() for j in jobs]))


def train_together(batch: Sequence[tuple[Any, Any]], ranks: Ranks) -> tuple[list[CohortResult], int]:
    """Train the cohorts of ``batch`` (``(run, prepared round)`` pairs, none skipped) in as few engine calls as exact.

    Returns each pair's :class:`~lfed.engine.CohortResult` (its own rows, in its cohort's order) and
    the number of engine calls. Every call is split over the ranks (:func:`lfed.engine.ranks.train_cohort`).
    """
    calls: dict[tuple, list[int]] = {}
    for i, (run, prep) in enumerate(batch):
        calls.setdefault(engine_key(run, prep.job), []).append(i)
    out: list[CohortResult | None] = [None] * len(batch)
    for part in calls.values():
        run, prep = batch[part[0]]
        if len(part) == 1:  # exactly what lfed.core.round.run_round does
            out[part[0]] = train_prepared(run.engine, ranks, prep)
            continue
        jobs = [batch[i][1].job for i in part]
        res = train_cohort(run.engine, ranks, merge_jobs(jobs))
        lo = 0
        for i, job in zip(part, jobs):
            k = job.index.shape[0]
            buffers = None if res.buffers is None else {n: b[lo : lo + k] for n, b in res.buffers.items()}
            out[i] = CohortResult(res.weights[lo : lo + k], res.loss[lo : lo + k], buffers)
            lo += k
    return out, len(calls)
