"""``lfed grid --config base.yaml --sweep sweeps/x.yaml``: a W&B grid sweep run locally as one Lightning job.

Every point of the grid is built exactly as ``lfed fit --config base.yaml <its --key=value>``
would build it (same parser, same seeding); all the runs then train together as one
:class:`~lfed.lightning.group.RunGroup` under one Lightning ``Trainer`` configured as ``lfed fit``'s (its
``--trainer.*`` settings, callbacks, progress bar, atomic checkpoints, DDP). Output, under
``<root>/grids/<sweep name>-<id>/`` (``<id>`` a hash of the runs' settings): ``group.json`` (the
runs and their parameters), ``checkpoints/last.ckpt`` (the whole group; ``--ckpt_path last``
resumes it exactly), per run ``<name>/metrics.csv`` (and its W&B run, in one W&B group) and
``<name>/summary.json``, and ``summary.csv``, the table printed at the end. See docs/grids.md.
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

from lightning.pytorch import Trainer

from lfed.core.settings import build_run
from lfed.lightning.cli import LfedCLI
from lfed.lightning.cli_loggers import wandb_logged_in
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.group import GroupMember, RunGroup, format_table
from lfed.lightning.member_logs import MemberLoggers
from lfed.lightning.module import FederatedModule
from lfed.lightning.reporting import MetricsCSV, config_id, silence_library_noise
from lfed.lightning.run_dirs import settings_of
from lfed.lightning.sweep import Sweep, load_sweep, member_name
from lfed.state.atomic import write_atomically

__all__ = ["build_members", "main", "run_grid", "train_group"]


def _build_run(class_type: type, *args: Any, applied_instantiation_links: dict | None = None, **settings: Any) -> Any:
    """The parser's instantiator of the ``model:`` section in a grid: the point's run (:func:`lfed.build_run`), not a
    LightningModule: the group is the one driver of all of them."""
    return build_run(**settings)


class _MemberCLI(LfedCLI):
    """``lfed fit``'s parsing of one grid point; its run, data module (and a Trainer, when asked) built by
    :meth:`build`, after ``lfed fit``'s seeding."""

    def _add_instantiators(self) -> None:
        super()._add_instantiators()
        self.parser.add_instantiator(_build_run, FederatedModule, subclasses=True, prepend=True)

    def before_instantiate_classes(self) -> None:
        silence_library_noise()

    def instantiate_classes(self) -> None:
        """Nothing yet: the grid first parses every point (their settings name the grid's directory), then builds."""

    def build(self, directory: Path | None = None) -> _MemberCLI:
        """Seed as ``lfed fit`` does, then build the point's run (``self.model``) and data module; with ``directory``
        also ``lfed fit``'s Trainer, writing there."""
        self.directory = directory
        if directory is not None:
            self.run_dir = directory
            self.config["trainer"]["default_root_dir"] = str(directory)
        self._set_seed()
        super().instantiate_classes()
        return self

    def instantiate_trainer(self, **kwargs: Any) -> Trainer | None:
        return super().instantiate_trainer(**kwargs) if self.directory is not None else None


def _member_cli(args: list[str]) -> _MemberCLI:
    try:
        return _MemberCLI(FederatedModule, FederatedDataModule, run=False, args=args, save_config_callback=None)
    except SystemExit as stop:
        raise ValueError(f"grid: the arguments {' '.join(args)} do not parse (the parser's message is above): "
                         "an unknown sweep parameter, or a value of the wrong type") from stop


def _point_args(configs: list[str], sweep: Sweep, point: dict, overrides: list[str] | None) -> list[str]:
    base = [a for c in configs for a in ("--config", c)] if configs else list(sweep.base_args)
    if not base:
        raise ValueError("grid: no base config: give --config base.yaml (the sweep's command names none)")
    return [*base, *Sweep.args_of(point), *(overrides or []), "--trainer.logger=false"]


def _parse_points(configs: list[str], sweep: Sweep, overrides: list[str] | None) -> tuple[list[tuple[dict, _MemberCLI]], dict]:
    """Every grid point parsed (not built) as ``lfed fit`` parses it; and their common trainer settings."""
    points, trainer = [], None
    for point in sweep.points():
        cli = _member_cli(_point_args(configs, sweep, point, overrides))
        cfg = cli.config
        this = json.loads(json.dumps(cfg.get("trainer").as_dict() if hasattr(cfg.get("trainer"), "as_dict") else cfg.get("trainer"), default=str))
        if trainer is None:
            trainer = this
        elif this != trainer:
            differ = sorted(k for k in set(this) | set(trainer) if this.get(k) != trainer.get(k))
            raise ValueError(f"trainer: grid point {point} sets {', '.join('trainer.' + k for k in differ)} otherwise than the "
                             "first point; the runs of a grid share one Trainer (rounds, evaluation, precision): "
                             "sweep these in separate grids")
        points.append((point, cli))
    return points, trainer or {}


def _members(points: list[tuple[dict, _MemberCLI]], directory: Path | None = None) -> list[GroupMember]:
    """Each parsed point's run and data (the first one's Trainer too, with ``directory``), in the grid's order."""
    return [GroupMember(member_name(i, point), cli.build(directory if i == 0 else None).model, cli.datamodule,
                        dict(point), settings_of(cli.config))
            for i, (point, cli) in enumerate(points)]


def build_members(configs: list[str], sweep: Sweep, overrides: list[str] | None = None) -> tuple[list[GroupMember], dict]:
    """One :class:`GroupMember` per grid point, its run built as ``lfed fit`` builds it (same parser, same seeding;
    :func:`lfed.build_run`); and their common trainer settings.

    Args:
        configs: Base ``--config`` files (the sweep's own ``command`` configs when empty).
        sweep: The grid (:func:`lfed.lightning.sweep.load_sweep`).
        overrides: ``--key=value`` arguments applied to every run (after the grid's).

    Raises:
        ValueError: If a point does not parse, or the points differ in their ``trainer`` settings
            (the runs of a group share one Trainer: rounds, evaluation interval, precision).
    """
    points, trainer = _parse_points(configs, sweep, overrides)
    return _members(points), trainer


def train_group(members: list[GroupMember], *, rounds: int, evaluate_every: int | None = None, precision: str = "32-true",
                loggers: bool = True, **trainer_kwargs: Any) -> tuple[RunGroup, Trainer]:
    """Train ``members`` as one :class:`RunGroup` with a plain Trainer (the Python API of ``lfed grid``).

    Args:
        rounds: Rounds (``max_steps``); ``evaluate_every``: rounds between evaluations (default: the end only).
        loggers: Route each member's metrics to its ``loggers`` (:class:`~lfed.lightning.member_logs.MemberLoggers`).
        trainer_kwargs: Other ``Trainer`` arguments (default: CPU, no checkpoint, no progress bar).
    """
    group = RunGroup(members)
    logger = MemberLoggers({m.name: m.loggers for m in members}) if loggers and any(m.loggers for m in members) else False
    kwargs = dict(accelerator="cpu", devices=1, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1)
    kwargs.update(trainer_kwargs)
    trainer = Trainer(max_steps=rounds, val_check_interval=evaluate_every or rounds, check_val_every_n_epoch=None,
                      precision=precision, logger=logger, **kwargs)
    trainer.fit(group, datamodule=group.datamodule)
    return group, trainer


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lfed grid",
        description="Run a W&B grid sweep locally as one Lightning job: all runs train together, one engine call per round.",
        epilog="Other --model.*/--data.*/--trainer.*/--seed_everything arguments apply to every run.",
    )
    p.add_argument("--config", action="append", default=[], help="Base config (repeatable; default: the sweep's command).")
    p.add_argument("--sweep", required=True, help="W&B sweep file of method: grid (sweeps/*.yaml).")
    p.add_argument("--root", default=None, help="Where grids/<name>-<id>/ goes (default: the current directory).")
    p.add_argument("--ckpt_path", default=None, help="'last' (this grid's last checkpoint) or a .ckpt file to resume from.")
    p.add_argument("--checkpoint_every", type=int, default=10, help="Rounds between checkpoints (0: none).")
    return p


def _member_logs(members: list[GroupMember], directory: Path, wandb_group: str | None) -> None:
    for m in members:
        m.loggers = [MetricsCSV(directory / m.name)]
        if wandb_group is not None:
            import wandb

            from lfed.lightning.reporting import QuietWandbLogger

            # quiet: a grid's runs print no W&B history each (the grid's own table says how they did); no git lookup
            # (W&B warns "git root does not exist" outside a repository)
            run = wandb.init(project="lfed", group=wandb_group, name=m.name, dir=str(directory / m.name),
                             config={**m.settings, "grid": m.params}, reinit="create_new",
                             settings=wandb.Settings(quiet=True, disable_git=True),
                             mode=os.environ.get("WANDB_MODE") or None)  # the mode the grid chose by, not one cached earlier
            m.loggers.append(QuietWandbLogger(experiment=run))


def _joined_overrides(rest: list[str]) -> list[str]:
    """``["--trainer.max_steps", "3"]`` -> ``["--trainer.max_steps=3"]``: an override's value given as the next word
    (as ``lfed fit`` takes it) joined to its key, so every override is one ``--key=value``."""
    out, i = [], 0
    while i < len(rest):
        a = rest[i]
        if a.startswith("--") and "=" not in a and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            out.append(f"{a}={rest[i + 1]}")
            i += 2
        else:
            out.append(a)
            i += 1
    return out


def run_grid(argv: list[str] | None = None) -> tuple[RunGroup, Path]:
    """Run ``lfed grid`` with ``argv`` (without the ``grid`` word); return the group and its directory."""
    silence_library_noise()
    args, rest = parser().parse_known_args(argv)
    overrides = _joined_overrides(rest)
    bad = [a for a in overrides if not a.startswith(("--model", "--data", "--trainer", "--seed_everything"))]
    if bad:
        raise ValueError(f"grid: unknown arguments {bad}; allowed: --config, --sweep, --root, --ckpt_path, --checkpoint_every "
                         "and --model.*/--data.*/--trainer.*/--seed_everything overrides for every run")
    loggers = [a.split("=", 1)[0] for a in overrides if a.split("=", 1)[0].split(".")[:2] == ["--trainer", "logger"]
               and a.lower() not in ("--trainer.logger=false", "--trainer.logger=null")]  # off, as the grid has it
    if loggers:  # it was dropped without a word (each point is parsed with --trainer.logger=false): issue 66 item 7
        raise ValueError(f"grid: {loggers[0]}: a grid logs each run itself, into grids/<sweep>-<id>/<run>/metrics.csv and, "
                         "unless WANDB_MODE=disabled, a W&B run of the grid's group; a logger of your own is not taken "
                         "(train_group(members, ...) with each member's loggers does, docs/grids.md)")
    if args.checkpoint_every < 0:
        raise ValueError(f"checkpoint_every: must be >= 0 rounds (0 turns it off), got {args.checkpoint_every}")
    sweep = load_sweep(args.sweep)
    points, _ = _parse_points(args.config, sweep, overrides + [f"--checkpoint_every={args.checkpoint_every}"])
    root = Path(args.root or os.getcwd())
    gid = config_id({"sweep": sweep.name, "members": [[member_name(i, point), settings_of(cli.config)]
                                                      for i, (point, cli) in enumerate(points)]})
    directory = root / "grids" / f"{sweep.name}-{gid}"
    last = directory / "checkpoints" / "last.ckpt"
    ckpt = args.ckpt_path
    if ckpt == "last":
        ckpt = str(last) if last.is_file() else None
        if ckpt is None:
            print(f"lfed grid: ckpt_path 'last' found no checkpoint of this grid in {directory}; starting it", file=sys.stderr)
    elif ckpt is None and last.is_file():
        raise ValueError(f"grid: {directory} already holds a checkpoint of this grid; pass --ckpt_path last to resume it, "
                         "or remove the directory to start again")
    # the runs, and the Trainer: lfed fit's, from the first point's settings (they are the same for every point)
    members = _members(points, directory)
    trainer = points[0][1].trainer
    wandb_group = None
    if os.environ.get("WANDB_MODE", "").strip().lower() != "disabled":
        wandb_group = f"{sweep.name}-{gid}"
        if not wandb_logged_in():
            os.environ.setdefault("WANDB_MODE", "offline")
    if trainer.is_global_zero:
        manifest = json.dumps({"sweep": sweep.name, "configs": args.config, "overrides": overrides,
                               "members": [{"name": m.name, "params": m.params} for m in members]}, indent=1, default=str)
        write_atomically(directory / "group.json", lambda f: f.write(manifest.encode()))
        _member_logs(members, directory, wandb_group)
        trainer.loggers = [MemberLoggers({m.name: m.loggers for m in members}, str(directory))]
    group = RunGroup(members)
    if trainer.is_global_zero:
        print(f"lfed grid: {len(members)} runs of {sweep.name} in {directory}")
    trainer.fit(group, datamodule=group.datamodule, ckpt_path=ckpt)
    if trainer.is_global_zero:
        _write_results(group, directory)
    return group, directory


def _write_results(group: RunGroup, directory: Path) -> None:
    for m in group.members:
        body = json.dumps({"name": m.name, "params": m.params, "status": m.status, "error": m.error,
                           "rounds_done": m.round, **m.summary}, indent=1, default=str).encode()
        write_atomically(directory / m.name / "summary.json", lambda f, body=body: f.write(body))
        for logger in m.loggers:
            experiment = getattr(logger, "_experiment", None)
            if experiment is not None and hasattr(experiment, "finish"):
                experiment.summary.update({**m.summary, "status": m.status})
                experiment.finish(exit_code=0 if m.status != "diverged" else 1)
    rows = group.table_rows()
    print(format_table(rows))
    chosen = [r for r in rows if r.get("val_last10pct_acc") is not None and r["status"] != "diverged"]
    if chosen:  # the choice a protocol makes: on the validation split, never on the test set
        best = max(chosen, key=lambda r: r["val_last10pct_acc"])
        print(f"lfed grid: best on the validation split (last-10% accuracy {best['val_last10pct_acc']:.4f}): {best['member']}")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    writer.writeheader()
    writer.writerows(rows)
    write_atomically(directory / "summary.csv", lambda f: f.write(buf.getvalue().encode()))


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``lfed grid``: clear one-line errors for bad input."""
    try:
        run_grid(sys.argv[2:] if argv is None else argv)
    except ValueError as e:
        if os.environ.get("LFED_DEBUG"):
            raise
        print(f"lfed grid: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
