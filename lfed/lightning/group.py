"""Many runs, one engine: a grid of federated runs trained together, in lock-step, under one Trainer.

Runs that share the model architecture and the dataset (a client-lr grid and its seeds, server
optimizer hyper-parameters, μ/λ/α, fraction, even algorithms) train side by side as ONE
:class:`RunGroup`, the one Lightning driver (:class:`lfed.lightning.driver.FederatedDriver`) of several
runs: every training step is one lock-step round in which each run prepares its own round (its
own cohort, state, rule and random streams), the cohorts of all runs are trained in as few
engine calls as is exact (:mod:`lfed.core.lockstep`), and each run finishes its round with its own
rows. Everything else is the path of a single run: evaluation, divergence, checkpoints (one
Lightning ``.ckpt`` of the whole group, resumed exactly with ``--ckpt_path last``), callbacks,
the progress bar, DDP. Each run logs as ``<name>/<metric>``, routed to its own logs
(:class:`lfed.lightning.member_logs.MemberLoggers`).

A member's result is the result of the same run trained alone (``lfed fit``) bit for bit in
float64 on the CPU when torch runs one intra-op thread (:mod:`lfed.core.lockstep`). ``lfed grid``
(:mod:`lfed.lightning.grid`) drives a group from a config and a W&B grid sweep file (docs/grids.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lfed.core.lockstep import concat_rules, rule_signature, stack_schedules
from lfed.lightning.driver import FederatedDriver

__all__ = ["GroupMember", "RunGroup", "check_same_model_and_data", "concat_rules", "format_table", "rule_signature",
           "stack_schedules"]


@dataclass
class GroupMember:
    """One run of a group.

    Attributes:
        name: The run's name (its directory under the group's, the prefix of its metrics).
        run: Its :class:`~lfed.core.run.FederatedRun` (:func:`lfed.build_run`, as ``lfed grid`` builds it from the point's
            settings); a driver of one run (a ``FederatedModule``) is taken as its run.
        datamodule: Its :class:`~lfed.lightning.datamodule.FederatedDataModule`.
        params: The grid point (``{key: value}``) that makes it differ from the others.
        settings: Its ``model``/``data``/``seed_everything`` settings (its logs' config).
        loggers: Its own logs (Lightning loggers, or objects with ``log_metrics(metrics, step)``).
    """

    name: str
    run: Any
    datamodule: Any
    params: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    loggers: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        runs = getattr(self.run, "runs", None)  # a FederatedModule: the driver of one run
        if runs is not None:
            if len(runs) != 1:
                raise ValueError(f"members: {self.name} is a driver of {len(runs)} runs; a member is one run")
            self.run = runs[0]

    @property
    def status(self) -> str:
        return self.run.status

    @property
    def error(self) -> str | None:
        return self.run.error

    @property
    def round(self) -> int:
        """Rounds the member has done."""
        return self.run.rounds_done

    @property
    def summary(self) -> dict[str, float]:
        return self.run.final_summary


class RunGroup(FederatedDriver):
    """Runs that share a model architecture and a dataset, trained in lock-step (module docstring).

    Fit it as any LightningModule: ``Trainer(max_steps=R, ...).fit(group, datamodule=group.datamodule)``
    (:func:`lfed.lightning.grid.fit_group` builds that Trainer with lfed's defaults).

    Args:
        members: The runs (:class:`GroupMember`), each with its module and data module.
    """

    def __init__(self, members: Sequence[GroupMember]) -> None:
        if not members:
            raise ValueError("members: a group needs at least one run")
        names = [m.name for m in members]
        if len(set(names)) != len(names) or any(not n or "/" in n for n in names):
            raise ValueError(f"members: names must be unique, non-empty and free of '/', got {names}")
        runs = []
        for m in members:
            m.run.name = m.name
            runs.append(m.run)
        super().__init__(runs, [m.datamodule for m in members])
        self.members = list(members)

    @property
    def grouped(self) -> bool:
        return True  # even a group of one logs as <name>/<metric>

    def setup(self, stage: str) -> None:
        super().setup(stage)
        check_same_model_and_data(self.runs)

    @property
    def datamodule(self):
        """The data module the Trainer is given (the first member's: its loaders count rounds and evaluations)."""
        return self.members[0].datamodule

    def table_rows(self) -> list[dict[str, Any]]:
        """One row per member: name, grid point, status, final and last-10% test accuracy, and the
        last-10% accuracy on the server's validation split when the data has one (choose on that one)."""
        rows = []
        validation = any(m.run.val_history for m in self.members)
        for m in self.members:
            run = m.run
            final = run.eval_history[-1][1] if run.eval_history else None
            row = {"member": m.name, **dict(m.params), "status": run.status, "rounds": run.rounds_done}
            if validation:
                row["val_last10pct_acc"] = run.last_rounds_accuracy(split="val")
            row.update(final_acc=final, last10pct_acc=run.last_rounds_accuracy())
            rows.append(row)
        return rows


def check_same_model_and_data(runs: Sequence[Any]) -> None:
    """Refuse runs of one group that differ in model architecture or dataset (after their set-up)."""
    first = runs[0]
    for run in runs[1:]:
        a, b = first, run
        if type(a.net) is not type(b.net) or list(zip(a.layout.names, a.layout.shapes)) != list(zip(b.layout.names, b.layout.shapes)):
            raise ValueError(
                f"members: {b.name} has another model ({type(b.net).__name__}, {b.layout.num_params:,} parameters) than "
                f"{a.name} ({type(a.net).__name__}, {a.layout.num_params:,} parameters); the runs of a group share "
                "the model architecture: put different models in different groups"
            )
        da, db = a.datamodule, b.datamodule
        if da.dataset_key() != db.dataset_key() or (da.dataset_key() is None and da.build().train_x is not db.build().train_x):
            raise ValueError(
                f"members: {b.name} trains on another dataset ({getattr(db, 'dataset', '?')}) than "
                f"{a.name} ({getattr(da, 'dataset', '?')}); the runs of a group share the dataset "
                "(the partition, its seed and the number of clients may differ)"
            )


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
