"""Many runs, one engine: a grid of federated runs trained together, in lock-step.

Runs that share the model architecture and the dataset (a client-lr grid and its seeds, server
optimizer hyper-parameters, μ/λ/α, fraction, even algorithms) train side by side: every
lock-step round, each run prepares its own round (:func:`lfed.round.prepare_round`: its own
cohort, state, rule and random streams), the cohorts of all runs are trained in ONE call of
:meth:`lfed.engine.CohortTrainer.train` over ``sum_r K_r`` rows (per-row start weights,
learning rates and batch schedules, the runs' step rules concatenated, chunked to bound
memory), and each run finishes its round with its own rows (:func:`lfed.round.finish_round`).

Each run keeps its own server optimizer, checkpoint, metrics and summary; a run that diverges
(NaN) stops alone. Runs whose step rules cannot be put in one call exactly (different kinds of
rule: e.g. FedAvg beside SCAFFOLD, or FedProx with another μ; loss terms; models with dropout
or buffers) are trained in separate engine calls of the same lock-step round.

A member's result is the result of the same run trained alone (``lfed fit``) bit for bit in
float64 on the CPU when torch runs one intra-op thread; with several threads, MKL may split a
batched product of 180 rows differently from one of 10, so rows agree to round-off (as
chunking does, :class:`~lfed.engine.CohortTrainer`). ``lfed grid`` (:mod:`lfed.grid`) drives a
group from a config and a W&B grid sweep file (docs/grids.md).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lfed.atomic import write_atomically
from lfed.engine import CohortResult, CohortTrainer, StepRule, batch_schedule, has_running_stats
from lfed.evaluation import (
    GlobalEvaluation,
    check_task,
    client_accuracies,
    is_classification,
    local_accuracy,
    worst_share_mean,
)
from lfed.params import ParamLayout
from lfed.reporting import MetricsCSV
from lfed.rng import seeded_global_rng
from lfed.round import PreparedRound, finish_round, prepare_round, setup_state

__all__ = ["GroupMember", "RunGroup", "concat_rules", "rule_signature", "stack_schedules"]


# --------------------------------------------------------------------------- engine rows of many runs


def rule_signature(rule: StepRule, dtype: torch.dtype) -> tuple | None:
    """What must agree for step rules to be concatenated exactly (None: never concatenated).

    ``grad_scale`` may differ (a float becomes a ``[K]`` tensor of the weights' dtype: the same
    single rounding); ``shift`` must be present in all or none; ``decay`` must be absent in all,
    a tensor in all, or the same float in all (a float decay is a fused multiply-add, a tensor
    decay is not, so they round differently). Rules with a loss term are not concatenated.
    """
    if rule.loss_term is not None:
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


def _has_dropout(net: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in net.modules())


def _batch_width(job) -> int:
    """``B'`` of the job's batch schedule (:func:`lfed.engine.batch_schedule`)."""
    max_n = int(job.num_examples.max())
    return max_n if job.batch_size is None else min(int(job.batch_size), max_n)


# --------------------------------------------------------------------------- one member


@dataclass
class GroupMember:
    """One run of a group.

    Attributes:
        name: The run's name (its directory under the group's).
        module: Its :class:`~lfed.module.FederatedModule` (components, net, training plan, seed).
        datamodule: Its :class:`~lfed.data.datamodule.FederatedDataModule`.
        params: The grid point (``{key: value}``) that makes it differ from the others.
        rounds: Rounds to train (the config's ``trainer.max_steps``).
        evaluate_every: Rounds between evaluations (the config's ``trainer.val_check_interval``).
        settings: Its ``model``/``data``/``seed_everything`` settings (stored in its checkpoint).
    """

    name: str
    module: Any
    datamodule: Any
    params: dict[str, Any] = field(default_factory=dict)
    rounds: int = 100
    evaluate_every: int = 10
    settings: dict[str, Any] = field(default_factory=dict)
    round: int = 0
    status: str = "running"
    error: str | None = None
    optimizer: torch.optim.Optimizer | None = None
    fed: Any = None
    logger: MetricsCSV | None = None
    wandb_run: Any = None
    summary: dict[str, float] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        """Whether the member still has rounds to train (not finished, not diverged)."""
        return self.status == "running" and self.round < self.rounds

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Write ``metrics`` of round ``step`` to the member's CSV (and W&B run)."""
        if self.logger is not None:
            self.logger.log_metrics(metrics, step)
        if self.wandb_run is not None:
            self.wandb_run.log(dict(metrics), step=step)


class RunGroup:
    """Runs that share a model architecture and a dataset, trained in lock-step (module docstring).

    Args:
        members: The runs (:class:`GroupMember`), each with its module and data module.
        directory: The group's directory: each member writes ``<name>/metrics.csv``,
            ``<name>/checkpoints/last.pt`` and ``<name>/summary.json`` there; None: nothing is written.
        checkpoint_every: Rounds between checkpoints of every member (0: none).
        dtype: The weights' dtype (``torch.float64`` for the precision ``64-true``).
        device: Where the runs train.
        wandb_group: Log every member as a W&B run of this group (None: no W&B).
        log: Where progress lines go (``print`` by default; None: silent).
    """

    def __init__(
        self,
        members: Sequence[GroupMember],
        directory: str | os.PathLike | None = None,
        *,
        checkpoint_every: int = 10,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        wandb_group: str | None = None,
        log: Callable[[str], None] | None = print,
    ) -> None:
        if not members:
            raise ValueError("members: a group needs at least one run")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError(f"members: names must be unique, got {names}")
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every: must be >= 0 rounds (0 turns it off), got {checkpoint_every}")
        self.members = list(members)
        self.directory = Path(directory) if directory is not None else None
        self.checkpoint_every = checkpoint_every
        self.dtype, self.device = dtype, torch.device(device)
        self.wandb_group = wandb_group
        self._print = log or (lambda s: None)
        self._ready = False
        self.engine_calls = 0

    # ----------------------------------------------------------------- setup
    def setup(self) -> None:
        """Build every member's data (one load of the shared dataset), net, state and optimizer."""
        if self._ready:
            return
        shared: dict[tuple, Any] = {}
        converted: dict[int, Tensor] = {}
        first = None
        for m in self.members:
            dm = m.datamodule
            if getattr(dm, "_user_train", None) is None:  # one load of a named dataset for the whole group
                key = (dm.dataset, str(dm.data_dir), dm.download)
                if key not in shared:
                    shared[key] = dm._load()
                loaded = shared[key]
                dm._load = lambda loaded=loaded: loaded
            data = dm.build()
            module = m.module
            if module.net is None:
                from lfed.models import MLP

                outputs = data.num_classes if data.num_classes is not None else math.prod(data.train_y.shape[1:])
                module.net = MLP(in_features=math.prod(data.train_x.shape[1:]), num_classes=outputs)
                module.layout = ParamLayout.from_module(module.net)
            module.net.to(device=self.device, dtype=self.dtype)
            module.layout = ParamLayout.from_module(module.net)
            check_task(module.net, data, module.loss)
            if first is None:
                first = m
            self._check_same_model(first, m)
            like = next(module.net.parameters()).detach()
            setup_state(module.components, module.store, data.client_sizes, module.layout.num_params, like)
            module.engine = CohortTrainer(module.net, module.loss, module.backend, module.chunk_size)
            m.fed = self._on_device(data, converted)
            if m.fed.task == "regression" and module.loss is None:
                raise ValueError(f"{m.name}: loss: the default (cross-entropy) needs class labels, but the targets are "
                                 "floating (regression); give a regression loss")
            trainable = [p for p in module.net.parameters() if p.requires_grad]
            m.optimizer = module.server_optimizer(trainable)
            self._composition_warnings(m)
        self._check_same_data()
        self._ready = True

    def _on_device(self, data, converted: dict[int, Tensor]):
        """The member's data on the device, tensors of the shared dataset converted once for all."""
        from dataclasses import fields

        out = {}
        for f in fields(data):
            v = getattr(data, f.name)
            if isinstance(v, Tensor):
                key = id(v)
                if key not in converted:
                    w = v.to(self.device)
                    if f.name in ("train_x", "test_x", "train_y", "test_y") and w.is_floating_point():
                        w = w.to(self.dtype)
                    converted[key] = w
                v = converted[key]
            out[f.name] = v
        return type(data)(**out)

    @staticmethod
    def _check_same_model(first: GroupMember, m: GroupMember) -> None:
        a, b = first.module, m.module
        if type(a.net) is not type(b.net) or [(n, s) for n, s in zip(a.layout.names, a.layout.shapes)] != [
            (n, s) for n, s in zip(b.layout.names, b.layout.shapes)
        ]:
            raise ValueError(
                f"members: {m.name} has another model ({type(b.net).__name__}, {b.layout.num_params:,} parameters) than "
                f"{first.name} ({type(a.net).__name__}, {a.layout.num_params:,} parameters); the runs of a group share "
                "the model architecture: put different models in different groups"
            )

    def _check_same_data(self) -> None:
        first = self.members[0]
        for m in self.members[1:]:
            if m.fed.train_x is not first.fed.train_x or m.fed.train_y is not first.fed.train_y:
                raise ValueError(
                    f"members: {m.name} trains on another dataset ({getattr(m.datamodule, 'dataset', '?')}) than "
                    f"{first.name} ({getattr(first.datamodule, 'dataset', '?')}); the runs of a group share the dataset "
                    "(the partition, its seed and the number of clients may differ)"
                )

    def _composition_warnings(self, m: GroupMember) -> None:
        from lfed import algorithms

        module, d = m.module, m.fed
        names = module.composition
        if names["weighting"] == "dwfed":
            d.require_labels("weighting='dwfed' (label-count weights)")
        for message in algorithms.validate_composition(
            names, module.explicit, p_inactive=module.participation.stragglers.p_inactive,
            p_incomplete=module.participation.stragglers.p_incomplete, mu=getattr(module.objective, "mu", None),
            efl_lambda=getattr(module.objective, "lam", None), num_clients=d.num_clients, total_rounds=m.rounds,
        ):
            warnings.warn(f"{m.name}: {message}", algorithms.CompositionWarning, stacklevel=2)

    # ----------------------------------------------------------------- one lock-step round
    def _server_step(self, m: GroupMember) -> Callable[[Tensor], Tensor]:
        return m.module.server_step(m.optimizer)

    def _engine_key(self, m: GroupMember, prepared: PreparedRound) -> tuple:
        """Members with equal keys train in one engine call."""
        job, module = prepared.job, m.module
        sig = rule_signature(job.rule, self.dtype)
        alone = sig is None or _has_dropout(module.net) or has_running_stats(module.net) or len(dict(module.net.named_buffers()))
        return (
            id(m) if alone else None, sig, job.batch_size, _batch_width(job), id(job.data_x), module.backend,
            module.chunk_size, repr(module.loss),
        )

    def train_engine_calls(self, batch: list[tuple[GroupMember, PreparedRound]]) -> dict[str, CohortResult]:
        """Train the cohorts of ``batch`` (members and their prepared rounds) in as few engine calls as exact."""
        calls: dict[tuple, list[tuple[GroupMember, PreparedRound]]] = {}
        for m, prep in batch:
            calls.setdefault(self._engine_key(m, prep), []).append((m, prep))
        out: dict[str, CohortResult] = {}
        for part in calls.values():
            self.engine_calls += 1
            if len(part) == 1:  # exactly what run_round does
                m, prep = part[0]
                with seeded_global_rng(prep.seed, prep.record.round, "dropout", prep.w.device):
                    out[m.name] = m.module.engine.train(*prep.job.args())
                continue
            jobs = [p.job for _, p in part]
            counts = [j.index.shape[0] for j in jobs]
            P = part[0][0].module.layout.num_params
            width = max(j.index.shape[1] for j in jobs)
            index = torch.cat([torch.nn.functional.pad(j.index, (0, width - j.index.shape[1])) for j in jobs])
            w0 = torch.cat([j.w_start.expand(k, P) for j, k in zip(jobs, counts)])
            lr = torch.cat([torch.full((k,), float(j.lr), dtype=torch.float64) for j, k in zip(jobs, counts)])
            schedule = stack_schedules([
                batch_schedule(j.num_examples, int(j.steps_done.detach().cpu().long().max()), j.batch_size, j.generator)
                for j in jobs
            ])
            rule = concat_rules([j.rule for j in jobs], counts, P, w0)
            engine = part[0][0].module.engine
            res = engine.train(w0, jobs[0].data_x, jobs[0].data_y, index, torch.cat([j.num_examples for j in jobs]),
                               torch.cat([j.steps_done for j in jobs]), rule, lr, jobs[0].batch_size, None,
                               schedule=schedule)
            lo = 0
            for (m, _), k in zip(part, counts):
                out[m.name] = CohortResult(res.weights[lo : lo + k], res.loss[lo : lo + k])
                lo += k
        return out

    def step(self) -> None:
        """One lock-step round: every running member's next round (members may be at different rounds after a resume)."""
        batch = []
        for m in self.members:
            if not m.running:
                continue
            module = m.module
            try:
                prep = prepare_round(module.components, module.layout.module_vector(module.net), m.fed,
                                     module.training_plan, module.engine, round=m.round, seed=module.seed,
                                     total_rounds=m.rounds, sizes=module.layout.sizes)
            except FloatingPointError as e:
                self._diverged(m, e)
                continue
            if prep.skipped:
                self._skipped(m, prep)
            else:
                batch.append((m, prep))
        results = self.train_engine_calls(batch) if batch else {}
        for m, prep in batch:
            try:
                _, rec = finish_round(m.module.components, prep, results[m.name], m.module.engine,
                                      server_step=self._server_step(m))
            except FloatingPointError as e:
                self._diverged(m, e)
                continue
            self._after_round(m, rec)

    def _diverged(self, m: GroupMember, error: Exception) -> None:
        m.status, m.error = "diverged", str(error)
        self._print(f"lfed grid: {m.name} stopped at round {m.round}: {error}")
        m.log({"run/diverged": 1.0}, m.round)
        self._write_summary(m)

    def _skipped(self, m: GroupMember, prep: PreparedRound) -> None:
        module, r = m.module, m.round
        warnings.warn(f"{m.name}: round {r}: no client's work counts (all inactive or dropped); the round is skipped",
                      stacklevel=2)
        module.bmta.add_round(prep.record.cohort.clients, None)
        m.optimizer.zero_grad(set_to_none=True)
        m.optimizer.step()
        metrics = {"round/skipped": 1.0, **module.comm.record(0, bits_down=prep.record.bits_down)}
        m.log(metrics, r)
        self._end_of_round(m)

    def _after_round(self, m: GroupMember, rec) -> None:
        module, r = m.module, m.round
        for message in rec.warnings:
            warnings.warn(f"{m.name}: round {r}: {message}", stacklevel=2)
        if rec.result.buffers is not None:
            module._aggregate_buffers(rec.result.buffers, rec.weights)
        counting, clients, d = rec.cohort.counting, rec.cohort.clients, m.fed
        local = None
        if is_classification(d.train_y):
            local = local_accuracy(module.net, module.layout, rec.result.weights[counting], d, clients[counting])
        metrics = rec.metrics()
        local_mean = module.bmta.add_round(clients, local)
        if local_mean is not None:
            metrics["client/local_acc_mean"] = local_mean
        metrics.update(module.comm.record(rec.uploads, bits_up=rec.bits_up, bits_down=rec.bits_down))
        m.log(metrics, r)
        self._end_of_round(m)

    def _end_of_round(self, m: GroupMember) -> None:
        m.round += 1
        if m.round % m.evaluate_every == 0 or m.round == m.rounds:
            self.evaluate(m)
        if self.checkpoint_every and (m.round % self.checkpoint_every == 0 or m.round == m.rounds):
            self.save_checkpoint(m)
        if m.round == m.rounds:
            self._finish(m)

    # ----------------------------------------------------------------- evaluation and summary
    def evaluate(self, m: GroupMember) -> dict[str, float]:
        """Evaluate the member's global model on the test set and its clients (as ``lfed fit``'s validation)."""
        module, d = m.module, m.fed
        bs = int(getattr(m.datamodule, "eval_batch_size", 2048))
        was_training = module.net.training
        module.net.eval()  # as Lightning's validation loop (dropout off)
        classification = is_classification(d.test_y)

        def global_metrics(x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
            ev = GlobalEvaluation()
            for lo in range(0, x.shape[0], bs):
                ev.update(module.net, module.loss_fn, x[lo : lo + bs], y[lo : lo + bs])
            return ev.compute(classification)

        try:
            metrics = global_metrics(d.test_x, d.test_y)
            per_client = client_accuracies(module.net, d, 0, 1, lambda t: t)
            val_acc = None
            if d.has_validation:  # the server's validation split (data.validation_fraction), as lfed fit's val/*
                val_metrics = global_metrics(d.train_x[d.val_index], d.train_y[d.val_index])
                metrics["val/loss"] = val_metrics["test/loss"]
                val_acc = val_metrics.get("test/acc")
                if val_acc is not None:
                    metrics["val/acc"] = val_acc
        finally:
            module.net.train(was_training)
        acc = metrics.get("test/acc")
        if per_client is not None:
            client = per_client[~torch.isnan(per_client)]
            metrics["client/acc_mean"] = float(client.mean())
            metrics["client/acc_worst10"] = worst_share_mean(client, 0.1)
        if val_acc is not None:
            module.val_history.append((m.round, val_acc))
        if acc is not None:
            module.eval_history.append((m.round, acc))
            module.comm.log_accuracy(acc)
            if per_client is not None:
                module.bmta.add_evaluation(per_client)
        m.log(metrics, m.round - 1)
        return metrics

    def _finish(self, m: GroupMember) -> None:
        m.status = "done"
        module = m.module
        summary: dict[str, float] = {}
        last = module.last_rounds_accuracy()
        if last is not None:
            summary["final/test_acc_last10pct"] = last
        last_val = module.last_rounds_accuracy(split="val")
        if last_val is not None:
            summary["final/val_acc_last10pct"] = last_val
        if module.eval_history:
            summary["final/test_acc"] = module.eval_history[-1][1]
        for target in module.accuracy_targets:
            hit = module.comm.rounds_to_reach(target)
            if hit is not None:
                summary[f"final/rounds_to_{target:g}"] = hit[0]
                summary[f"final/uploads_to_{target:g}"] = hit[1]
        summary["final/uploads_total"] = module.comm.uploads
        summary.update(module.bmta.summary())
        m.summary = summary
        m.log(summary, m.round - 1)
        self._write_summary(m)

    def _write_summary(self, m: GroupMember) -> None:
        if m.logger is not None:
            m.logger.save()
        if m.wandb_run is not None:
            m.wandb_run.summary.update({**m.summary, "status": m.status})
            m.wandb_run.finish(exit_code=0 if m.status != "diverged" else 1)
            m.wandb_run = None
        if self.directory is None:
            return
        body = json.dumps({"name": m.name, "params": m.params, "status": m.status, "error": m.error,
                           "rounds_done": m.round, **m.summary}, indent=1, default=str).encode()
        write_atomically(self.directory / m.name / "summary.json", lambda f: f.write(body))

    # ----------------------------------------------------------------- checkpoints
    def checkpoint_path(self, m: GroupMember) -> Path | None:
        """``<directory>/<name>/checkpoints/last.pt`` (None without a directory)."""
        return None if self.directory is None else self.directory / m.name / "checkpoints" / "last.pt"

    def save_checkpoint(self, m: GroupMember) -> None:
        """Write the member's whole state (atomically): weights, components' state, optimizer, counters."""
        path = self.checkpoint_path(m)
        if path is None:
            return
        module = m.module
        state = {
            "round": m.round, "name": m.name, "params": m.params, "settings": m.settings,
            "module": module.state_dict(), "optimizer": m.optimizer.state_dict(),
            "lfed": {"comm": module.comm.state_dict(), "eval_history": list(module.eval_history),
                     "val_history": list(module.val_history), "bmta": module.bmta.state_dict()},
        }
        write_atomically(path, lambda f: torch.save(state, f))
        if m.logger is not None:
            m.logger.save()

    def resume(self) -> list[str]:
        """Load every member's last checkpoint (members without one start at round 0); return the resumed names."""
        self.setup()
        resumed = []
        for m in self.members:
            path = self.checkpoint_path(m)
            if path is None or not path.is_file():
                continue
            state = torch.load(path, map_location=self.device, weights_only=False)
            if state.get("params") != json.loads(json.dumps(m.params, default=str)) and state.get("params") != m.params:
                raise ValueError(f"{m.name}: the checkpoint {path} is of another grid point {state.get('params')} "
                                 f"than this member's {m.params}; resume the group with the sweep it was started with")
            m.module.load_state_dict(state["module"])
            m.optimizer.load_state_dict(state["optimizer"])
            lf = state["lfed"]
            m.module.comm.load_state_dict(lf["comm"])
            m.module.eval_history = [tuple(x) for x in lf["eval_history"]]
            m.module.val_history = [tuple(x) for x in lf.get("val_history", [])]
            m.module.bmta.load_state_dict(lf["bmta"])
            m.round = int(state["round"])
            if m.round >= m.rounds:
                m.status = "done"
            resumed.append(m.name)
        return resumed

    # ----------------------------------------------------------------- the whole grid
    def _open_logs(self) -> None:
        for m in self.members:
            if self.directory is not None and m.logger is None:
                m.logger = MetricsCSV(self.directory / m.name)
            if self.wandb_group is not None and m.wandb_run is None and m.status == "running":
                import wandb

                save = str(self.directory / m.name) if self.directory is not None else None
                m.wandb_run = wandb.init(project="lfed", group=self.wandb_group, name=m.name, dir=save,
                                         config={**m.settings, "grid": m.params}, reinit="create_new")

    def fit(self, resume: bool = False) -> list[dict[str, Any]]:
        """Train every member to its last round; return :meth:`table_rows`.

        Args:
            resume: Continue from the members' checkpoints in ``directory`` (exact per member).
        """
        self.setup()
        if resume:
            names = self.resume()
            self._print(f"lfed grid: resumed {len(names)} of {len(self.members)} runs from their checkpoints")
        self._open_logs()
        start, ticks = time.perf_counter(), 0
        while any(m.running for m in self.members):
            self.step()
            ticks += 1
            if ticks % 10 == 0:
                running = [m for m in self.members if m.running]
                self._print(f"lfed grid: {len(running)} of {len(self.members)} runs still training, rounds "
                            f"{min((m.round for m in running), default=0)}-{max(m.round for m in self.members)}, "
                            f"{time.perf_counter() - start:.1f}s")
        for m in self.members:
            if m.logger is not None:
                m.logger.save()
        return self.table_rows()

    def table_rows(self) -> list[dict[str, Any]]:
        """One row per member: name, grid point, status, final and last-10% test accuracy, and the
        last-10% accuracy on the server's validation split when the data has one (choose on that one)."""
        rows = []
        validation = any(m.module.val_history for m in self.members)
        for m in self.members:
            final = m.module.eval_history[-1][1] if m.module.eval_history else None
            row = {"member": m.name, **{k: v for k, v in m.params.items()}, "status": m.status, "rounds": m.round}
            if validation:
                row["val_last10pct_acc"] = m.module.last_rounds_accuracy(split="val")
            row.update(final_acc=final, last10pct_acc=m.module.last_rounds_accuracy())
            rows.append(row)
        return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The summary table as aligned text."""
    if not rows:
        return ""
    keys = list(dict.fromkeys(k for r in rows for k in r))

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
        return str(v)

    cells = [[cell(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
