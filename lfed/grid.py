"""``lfed grid --config base.yaml --sweep sweeps/x.yaml``: a W&B grid sweep run locally as one batched job.

Every point of the grid is built exactly as ``lfed fit --config base.yaml <its --key=value>``
would build it (same parser, same seeding), then all the runs train together in a
:class:`~lfed.group.RunGroup` (one engine call per lock-step round for the cohorts of all
runs). Output, under ``<root>/grids/<sweep name>-<id>/`` (``<id>`` a hash of the runs'
settings): ``group.json`` (the runs and their parameters), per run ``<name>/metrics.csv``,
``<name>/checkpoints/last.pt`` and ``<name>/summary.json``, and ``summary.csv``, the table
printed at the end (run, parameters, status, final and last-10% test accuracy).
``--resume`` continues a killed group from each run's checkpoint. See docs/grids.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from lfed.atomic import write_atomically
from lfed.cli import LfedCLI, wandb_logged_in
from lfed.data.datamodule import FederatedDataModule
from lfed.group import GroupMember, RunGroup, format_table
from lfed.module import FederatedModule
from lfed.reporting import config_id, silence_library_noise
from lfed.sweep import Sweep, load_sweep, member_name

__all__ = ["build_members", "main", "run_grid"]

#: ``trainer.precision`` values a group trains in, and their dtype.
PRECISIONS = {"32-true": torch.float32, "32": torch.float32, "64-true": torch.float64, "64": torch.float64}


class _MemberCLI(LfedCLI):
    """``lfed fit``'s parsing, seeding and instantiation of model and data, without a Trainer or run directory."""

    def before_instantiate_classes(self) -> None:
        silence_library_noise()

    def instantiate_trainer(self, **kwargs: Any) -> None:
        return None


def _member_cli(args: list[str]) -> _MemberCLI:
    try:
        return _MemberCLI(FederatedModule, FederatedDataModule, run=False, args=args, save_config_callback=None)
    except SystemExit as stop:
        raise ValueError(f"grid: the arguments {' '.join(args)} do not parse (the parser's message is above): "
                         "an unknown sweep parameter, or a value of the wrong type") from stop


def build_members(configs: list[str], sweep: Sweep, overrides: list[str] | None = None) -> tuple[list[GroupMember], torch.dtype]:
    """One :class:`GroupMember` per grid point, built as ``lfed fit`` builds the run; and the group's dtype.

    Args:
        configs: Base ``--config`` files (the sweep's own ``command`` configs when empty).
        sweep: The grid (:func:`lfed.sweep.load_sweep`).
        overrides: ``--key=value`` arguments applied to every run (after the grid's).
    """
    base = [a for c in configs for a in ("--config", c)] if configs else list(sweep.base_args)
    if not base:
        raise ValueError("grid: no base config: give --config base.yaml (the sweep's command names none)")
    members, dtypes = [], {}
    for i, point in enumerate(sweep.points()):
        args = [*base, *Sweep.args_of(point), *(overrides or []), "--trainer.logger=false"]
        cli = _member_cli(args)
        cfg = cli.config
        trainer = cfg.get("trainer") or {}
        precision = str(trainer.get("precision") if trainer.get("precision") is not None else "32-true")
        if precision not in PRECISIONS:
            raise ValueError(f"trainer.precision: {precision!r} for grid point {point}; lfed grid trains in "
                             f"{sorted(PRECISIONS)} (mixed precision is not supported in a group)")
        max_steps = trainer.get("max_steps")
        if max_steps is None or max_steps <= 0:
            raise ValueError(f"trainer.max_steps: the rounds of grid point {point} must be > 0, got {max_steps}")
        every = trainer.get("val_check_interval") or 10
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"trainer.val_check_interval: a number of rounds >= 1 in lfed grid, got {every!r}")
        name = member_name(i, point)
        dtypes[name] = PRECISIONS[precision]
        settings = cli._settings(cfg)
        members.append(GroupMember(name, cli.model, cli.datamodule, dict(point), int(max_steps), int(every), settings))
    if len(set(dtypes.values())) > 1:
        raise ValueError(f"trainer.precision: the runs of a group train in one precision, got {dtypes}")
    return members, next(iter(dtypes.values()))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lfed grid",
        description="Run a W&B grid sweep locally as one batched job: all runs train together, one engine call per round.",
        epilog="Other --model.*/--data.*/--trainer.*/--seed_everything arguments apply to every run.",
    )
    p.add_argument("--config", action="append", default=[], help="Base config (repeatable; default: the sweep's command).")
    p.add_argument("--sweep", required=True, help="W&B sweep file of method: grid (sweeps/*.yaml).")
    p.add_argument("--root", default=None, help="Where grids/<name>-<id>/ goes (default: the current directory).")
    p.add_argument("--resume", action="store_true", help="Continue the group from each run's last checkpoint.")
    p.add_argument("--checkpoint_every", type=int, default=10, help="Rounds between checkpoints (0: none).")
    return p


def run_grid(argv: list[str] | None = None) -> tuple[RunGroup, Path]:
    """Run ``lfed grid`` with ``argv`` (without the ``grid`` word); return the group and its directory."""
    silence_library_noise()
    args, overrides = parser().parse_known_args(argv)
    bad = [a for a in overrides if not a.startswith(("--model", "--data", "--trainer", "--seed_everything"))]
    if bad:
        raise ValueError(f"grid: unknown arguments {bad}; allowed: --config, --sweep, --root, --resume, --checkpoint_every "
                         "and --model.*/--data.*/--trainer.*/--seed_everything overrides for every run")
    if args.checkpoint_every < 0:
        raise ValueError(f"checkpoint_every: must be >= 0 rounds (0 turns it off), got {args.checkpoint_every}")
    sweep = load_sweep(args.sweep)
    members, dtype = build_members(args.config, sweep, overrides)
    root = Path(args.root or os.getcwd())
    gid = config_id({"sweep": sweep.name, "members": [[m.name, m.settings] for m in members]})
    directory = root / "grids" / f"{sweep.name}-{gid}"
    has_checkpoints = directory.is_dir() and any(directory.glob("*/checkpoints/last.pt"))
    if has_checkpoints and not args.resume:
        raise ValueError(f"grid: {directory} already holds checkpoints of this grid; pass --resume to continue it, "
                         "or remove the directory to start again")
    manifest = json.dumps({"sweep": sweep.name, "configs": args.config, "overrides": overrides,
                           "members": [{"name": m.name, "params": m.params} for m in members]}, indent=1, default=str)
    write_atomically(directory / "group.json", lambda f: f.write(manifest.encode()))
    wandb_group = None
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode != "disabled":
        wandb_group = f"{sweep.name}-{gid}"
        if not wandb_logged_in():
            os.environ.setdefault("WANDB_MODE", "offline")
    group = RunGroup(members, directory, checkpoint_every=args.checkpoint_every, dtype=dtype, wandb_group=wandb_group)
    print(f"lfed grid: {len(members)} runs of {sweep.name} in {directory}")
    rows = group.fit(resume=args.resume)
    table = format_table(rows)
    print(table)
    chosen = [r for r in rows if r.get("val_last10pct_acc") is not None and r["status"] == "done"]
    if chosen:  # the choice a protocol makes: on the validation split, never on the test set
        best = max(chosen, key=lambda r: r["val_last10pct_acc"])
        print(f"lfed grid: best on the validation split (last-10% accuracy {best['val_last10pct_acc']:.4f}): {best['member']}")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    writer.writeheader()
    writer.writerows(rows)
    write_atomically(directory / "summary.csv", lambda f: f.write(buf.getvalue().encode()))
    return group, directory


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``lfed grid``: clear one-line errors for bad input."""
    try:
        run_grid(sys.argv[2:] if argv is None else argv)
    except ValueError as e:
        print(f"lfed grid: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
