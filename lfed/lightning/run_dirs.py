"""Where ``lfed fit|validate|test`` (:mod:`lfed.lightning.cli`) writes, and what a resume or an evaluation continues.

* A new run gets its own directory, ``<root>/runs/<algorithm>-<dataset>-<config id>/version_<n>/``
  (:func:`new_run_dir`; :func:`lfed.lightning.reporting.run_directory` numbers the versions); a DDP worker writes into
  its rank 0's (:data:`RUN_DIR_ENV`).
* ``--ckpt_path last`` resumes the latest checkpoint of the same configuration (:func:`resume_last`), in its own
  directory, and refuses to start afresh when only a run with other settings has one
  (:func:`refuse_a_sibling_checkpoint`); ``fit --ckpt_path <file>`` continues in the file's run directory when it is
  one of this configuration (:func:`continued_run_dir`).
* ``lfed validate|test`` writes into the run it scores (``<run>/validate/``: :func:`evaluation_dir`), with the settings
  the checkpoint records (:data:`CONFIG_KEY`, written by :class:`RunConfig`); a config that contradicts them is
  refused (:func:`check_config_fits_checkpoint`).
* A run refused before its first step leaves nothing behind (:func:`discard_run_dir`).
* ``config.yaml`` is written into the run directory whatever the loggers (:class:`RunSaveConfig`), which
  :func:`lfed.lightning.cli_loggers.point_loggers_at_run` points the loggers into: one run, one folder.
* A Ctrl-C during ``lfed fit`` ends with one line: the round it stopped in, the checkpoint to continue from and the
  command that continues it (:class:`ResumeNote`).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from lfed.lightning.checkpoint import read_checkpoint
from lfed.lightning.cli_loggers import WANDB_ID_KEY, finish_wandb_runs
from lfed.lightning.reporting import flat_settings, latest_checkpoint, run_directory

#: Where the run's settings are stored in a checkpoint (plain values, readable with ``weights_only``).
CONFIG_KEY = "lfed_config"

#: Environment variable through which DDP worker processes find their rank 0's run directory.
RUN_DIR_ENV = "LFED_RUN_DIR"


class RunConfig(Callback):
    """The run's ``model``, ``data`` and ``seed_everything`` settings: in every checkpoint and in the loggers.

    ``lfed validate|test --ckpt_path X`` rebuilds the model and data from them (no config needed).
    Once the run's checks have passed (the start of training or evaluation) every logger gets them as
    hyperparameters under their config names
    (``model.seed``, ``data.seed``: :func:`lfed.lightning.reporting.flat_settings`).
    """

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings

    def _log(self, trainer: Trainer, *args: Any) -> None:
        """The settings to every logger, once, when the run's checks have passed (a refused run starts no W&B run)."""
        if getattr(self, "_logged", False):
            return
        self._logged = True
        params = flat_settings(self.settings)
        for logger in trainer.loggers:
            logger.log_hyperparams(params)

    on_validation_start = on_test_start = on_predict_start = _log

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        """The settings to the loggers, and what this stretch of the run's bits depend on to ``environment.json``."""
        self._log(trainer)
        if trainer.is_global_zero and trainer.default_root_dir:
            record_environment(Path(trainer.default_root_dir) / "environment.json", trainer.global_step,
                               trainer.strategy.root_device)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint[CONFIG_KEY] = self.settings
        for logger in trainer.loggers:  # the W&B run this checkpoint continues, when one was started
            run = getattr(logger, "_experiment", None)
            if "Wandb" in type(logger).__name__ and isinstance(getattr(run, "id", None), str):
                checkpoint[WANDB_ID_KEY] = run.id


class RunSaveConfig(SaveConfigCallback):
    """The command's configuration as ``config.yaml`` in the run directory (the Trainer's ``default_root_dir``).

    Lightning's ``SaveConfigCallback`` writes it into the first logger's folder (``trainer.log_dir``): with
    ``--trainer.logger CSVLogger`` that was the logger's ``lightning_logs/version_<n>``, away from the checkpoints and
    lfed's ``metrics.csv`` (issue 66 item 7); with MLflow, its store. Rank 0 writes it, once per command.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["save_to_log_dir"] = False  # save_config below writes it, into the run directory
        super().__init__(*args, **kwargs)

    def save_config(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        run_dir = Path(trainer.default_root_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.parser.save(self.config, str(run_dir / self.config_filename), skip_none=False, overwrite=self.overwrite,
                         multifile=self.multifile)


class ResumeNote(Callback):
    """After a Ctrl-C in ``lfed fit``: one line on stderr, the last thing the command prints (issue 66 item 6).

    Lightning stops the run itself (its "attempting graceful shutdown" line, the loggers closed, exit status 1) and
    calls the callbacks' ``on_exception`` on the way: this one then says in which round the run stopped, which
    checkpoint holds how many rounds, and the command that continues from it (the command as given, with
    ``--ckpt_path`` that file), or that there is no checkpoint yet (``--checkpoint_every``). The rounds a checkpoint
    holds are those done when it was written (``on_save_checkpoint``), or, resumed and not saved since, those the run
    started from.

    Args:
        args: The command line after ``lfed`` (default: ``sys.argv[1:]``), for the command that continues.
        every: Rounds between checkpoints (``--checkpoint_every``), for the line without a checkpoint.
    """

    #: Where the line goes instead of stderr while the ``lfed`` command runs (:func:`lfed.lightning.cli.main` prints it
    #: after Lightning has closed the loggers, so that it is the last line, after W&B's footer); None: printed at once.
    deferred: list[str] | None = None

    def __init__(self, args: list[str] | None = None, every: int | None = None) -> None:
        self.args = list(sys.argv[1:] if args is None else args)
        self.every = every
        self.saved_round: int | None = None
        self.line: str | None = None

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        if trainer.ckpt_path is not None and self.saved_round is None:
            self.saved_round = int(trainer.global_step)  # what the checkpoint it resumed from holds

    def on_save_checkpoint(self, trainer: Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self.saved_round = int(checkpoint.get("global_step", trainer.global_step))

    def checkpoint_file(self, trainer: Trainer) -> Path | None:
        """The newest file a checkpoint callback of the run wrote (or resumed from), None when there is none yet."""
        found = [Path(path) for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)
                 for path in (c.last_model_path, c.best_model_path) if path and Path(path).is_file()]
        return max(found, key=lambda p: p.stat().st_mtime) if found else None

    @staticmethod
    def shown(path: Path) -> str:
        """``path`` relative to the current directory when under it."""
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd().resolve()) else str(path)

    def continue_command(self, ckpt: Path) -> str:
        """The command as given, with ``--ckpt_path`` the checkpoint."""
        args, skip = [], False
        for a in self.args:
            if skip:
                skip = False
                continue
            if a == "--ckpt_path":
                skip = True
                continue
            if not a.startswith("--ckpt_path="):
                args.append(a)
        return shlex.join(["lfed", *args, "--ckpt_path", self.shown(ckpt)])

    def message(self, trainer: Trainer) -> str:
        """The line after a Ctrl-C in round ``trainer.global_step + 1``."""
        stopped = f"lfed fit: interrupted in round {int(trainer.global_step) + 1}"
        if trainer.max_steps and trainer.max_steps > 0:
            stopped += f" of {trainer.max_steps}"
        ckpt = self.checkpoint_file(trainer)
        if ckpt is None:
            every = f" (one every {self.every} rounds: --checkpoint_every)" if self.every else ""
            return f"{stopped}, before its first checkpoint{every}: nothing to continue from; run the command again to start over"
        held = f" ({self.saved_round} rounds done)" if self.saved_round is not None else ""
        return f"{stopped}; the last checkpoint is {self.shown(ckpt)}{held}; continue with: {self.continue_command(ckpt)}"

    @rank_zero_only
    def on_exception(self, trainer: Trainer, pl_module: Any, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt) and trainer.state.fn == "fit":
            self.line = self.message(trainer)
            if ResumeNote.deferred is not None:
                ResumeNote.deferred.append(self.line)
            else:
                print(self.line, file=sys.stderr, flush=True)


def record_environment(path: Path, round: int, device: Any = None) -> None:
    """Add this process's environment (:func:`lfed.state.environment.environment`), from ``round`` on, to the run's
    ``environment.json``: a list with one record per start or resume, so each stretch of the run says what its
    bits depend on (docs/reproducibility.md)."""
    from lfed.state.environment import environment

    records = []
    if path.is_file():
        try:
            records = json.loads(path.read_text())
        except (OSError, ValueError):
            records = []
    records = [r for r in records if isinstance(r, dict) and r.get("from_round", 0) < round]  # a rerun replaces
    records.append({"from_round": round, **environment(device)})
    path.write_text(json.dumps(records, indent=1) + "\n")


def _plain(value: Any) -> Any:
    """A JSON-able copy of a parsed config value (Namespaces -> dicts, paths -> str)."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    return json.loads(json.dumps(value, default=str))


def settings_of(cfg) -> dict[str, Any]:
    """A run's ``model``, ``data`` and ``seed_everything`` settings as plain values (its identity: the config id)."""
    return {"model": _plain(cfg.get("model")), "data": _plain(cfg.get("data")), "seed_everything": _plain(cfg.get("seed_everything"))}


def refuse_a_sibling_checkpoint(config_dir: Path, settings: dict[str, Any]) -> None:
    """``--ckpt_path last`` with a changed setting (``--model.training.client_lr 0.1``, "resume with a lower lr")
    finds no checkpoint of the new configuration; when a run of the same method on the same data has one, starting
    a fresh run would silently not be what was asked: refused, naming the checkpoint, the settings that differ and
    both ways on (issue 51 item 2). With no such run, ``last`` starts a new one (the idiom "resume if there is
    anything to resume")."""
    prefix = config_dir.name.rsplit("-", 1)[0] + "-"
    others = [p for p in config_dir.parent.glob(f"{glob_escape(prefix)}*/version_*/checkpoints/last.ckpt")
              if p.parent.parent.parent != config_dir and p.parent.parent.parent.name.rsplit("-", 1)[0] + "-" == prefix]
    if not others:
        return
    latest = max(others, key=lambda p: p.stat().st_mtime)
    try:
        theirs = read_checkpoint(str(latest)).get(CONFIG_KEY) or {}
    except Exception:  # noqa: BLE001 - an unreadable neighbour: its differences are unknown, the refusal stands
        theirs = {}
    mine, saved = flat_settings(settings), flat_settings(theirs)
    differ = [k for k in sorted(set(mine) | set(saved)) if k != "data.data_dir" and mine.get(k) != saved.get(k)]
    shown = "; ".join(f"{k}: {saved.get(k)!r} there, {mine.get(k)!r} here" for k in differ[:3])
    more = f"; ... {len(differ)} settings in all" if len(differ) > 3 else ""
    raise ValueError(f"ckpt_path: 'last' found no checkpoint of this configuration, but {latest} is a run of the same "
                     f"method and data with other settings ({shown or 'settings unreadable'}{more}); to continue it "
                     f"with these settings give --ckpt_path {latest}, to start a new run drop --ckpt_path")


def check_config_fits_checkpoint(ckpt: str, given: dict[str, Any], saved: dict[str, Any], given_args: Any) -> None:
    """``lfed validate|test --config A --ckpt_path <run of B>``: refused, naming the settings that differ.

    Only settings the command gave (``--config``, ``--model.*``, ``--data.*``, ``--seed_everything``) are
    compared; without them the checkpoint's own settings are used. ``data.data_dir`` may differ (where the
    data is on this machine). ``given_args``: the command's arguments (None: none known).
    """
    flags = [a for a in given_args or [] if isinstance(a, str) and a.startswith("--")]
    if not any(a.split("=", 1)[0] == "--config" or (a.startswith(("--model", "--data", "--seed_everything"))
                                                     and not a.startswith("--data.data_dir")) for a in flags):
        return
    mine, theirs = flat_settings(given), flat_settings(saved)
    differ = [k for k in sorted(set(mine) | set(theirs))
              if k != "data.data_dir" and mine.get(k) != theirs.get(k)]
    if differ:
        shown = "; ".join(f"{k}: checkpoint {theirs.get(k)!r}, config {mine.get(k)!r}" for k in differ[:4])
        more = f"; ... {len(differ)} settings in all" if len(differ) > 4 else ""
        raise ValueError(f"ckpt_path: {ckpt} was written by another configuration than this command's ({shown}{more}); "
                         "drop --config (the checkpoint holds its own settings) or give the run's own")


def resume_last(cfg: Any, config_dir: Path, settings: dict[str, Any], subcommand: str | None) -> Path | None:
    """``--ckpt_path last``: the latest checkpoint of this configuration (under ``config_dir``), set as the command's
    ``ckpt_path``; None when there is none (``fit`` starts a new run, unless a run with other settings has one:
    :func:`refuse_a_sibling_checkpoint`; ``validate``/``test`` are refused: they score a trained model)."""
    found = latest_checkpoint(config_dir)
    if found is None and subcommand == "fit":
        refuse_a_sibling_checkpoint(config_dir, settings)
    if found is None:
        rank_zero_warn(f"ckpt_path: 'last' found no checkpoint of this configuration under {config_dir}; starting a new run")
        cfg["ckpt_path"] = None
    else:
        rank_zero_info(f"lfed: resuming {found}")
        cfg["ckpt_path"] = str(found)
    if subcommand in ("validate", "test") and found is None:
        raise ValueError(f"ckpt_path: 'last' found no checkpoint of this configuration under {config_dir}; "
                         f"lfed {subcommand} scores a trained model: give its --ckpt_path <file.ckpt>")
    return found


def continued_run_dir(ckpt: str, config_dir: Path) -> Path | None:
    """``lfed fit --ckpt_path <file>``: the run directory the file belongs to when it is a run of this configuration
    (the run continues in its own directory); None for another file. A file that is not an lfed checkpoint is refused
    here, before any round."""
    read_checkpoint(ckpt)  # a file that is not an lfed checkpoint fails here, before any round
    path = Path(ckpt).resolve()
    if path.parent.name == "checkpoints" and path.parent.parent.parent == config_dir.resolve():
        return path.parent.parent  # continue in the run's own directory
    return None


def evaluation_dir(ckpt: Any, subcommand: str) -> tuple[Path | None, Path | None]:
    """``lfed validate|test`` of a checkpoint of an lfed run writes into that run (``<run>/validate/``), not a new one:
    that directory and, when this command made it, the same again (None, None for a checkpoint outside a run)."""
    checkpoint = Path(str(ckpt))
    if checkpoint.parent.name == "checkpoints" and checkpoint.parent.parent.is_dir():
        run_dir = checkpoint.parent.parent / subcommand
        if not run_dir.is_dir():
            run_dir.mkdir()
            return run_dir, run_dir
        return run_dir, None
    return None, None


def new_run_dir(config_dir: Path, root: Path) -> tuple[Path, Path | None]:
    """A new run's directory (a new ``version_<n>`` under ``config_dir``) and, the same, as made by this command; a DDP
    worker's is its rank 0's (:data:`RUN_DIR_ENV`), made by that rank (None)."""
    inherited = os.environ.get(RUN_DIR_ENV)
    if inherited and os.environ.get("LOCAL_RANK", "0") != "0":
        return Path(inherited), None  # a DDP worker: rank 0 chose the directory
    try:
        run_dir = run_directory(config_dir)
    except OSError as err:  # a read-only working folder, a file where a folder goes
        raise ValueError(f"trainer.default_root_dir: cannot create the run's folder under {root} "
                         f"({err.strerror or err}); run lfed from a folder you can write to, or give "
                         "--trainer.default_root_dir <a writable folder>") from None
    return run_dir, run_dir


def discard_run_dir(created: Path | None, loggers: Any) -> bool:
    """Remove the run directory a command made (``created``: its ``config.yaml``, an offline W&B run, which is closed
    first), and its configuration's directory when that is left empty: a run refused before its first step leaves
    nothing. Whether it was removed (not on a DDP worker, nor when there is none)."""
    import shutil

    if created is None or not created.is_dir() or os.environ.get("LOCAL_RANK", "0") != "0":
        return False
    finish_wandb_runs(loggers)
    shutil.rmtree(created, ignore_errors=True)
    for parent in (created.parent, created.parent.parent):  # runs/<configuration>, then runs/ when left empty
        if parent.name and parent.is_dir() and not any(parent.iterdir()) and parent != Path(os.getcwd()):
            parent.rmdir()
    return True
