"""The loggers of ``lfed fit|validate|test`` (:mod:`lfed.lightning.cli`): Weights & Biases by default, in the run directory.

* :func:`default_logger`: W&B, online when the user is logged in (:func:`wandb_logged_in`), offline otherwise;
  ``WANDB_MODE=disabled`` turns W&B off (the metrics CSV is still written).
* :func:`point_loggers_at_run`: the W&B files, a ``CSVLogger``'s or ``TensorBoardLogger``'s and the metrics CSV go into
  the run's directory (one run, one folder: issue 66 item 7), and a resumed run continues its W&B run (the id its
  checkpoint records under :data:`WANDB_ID_KEY`: :func:`wandb_id`).
* :func:`logger_root`: a ``save_dir`` given to such a logger is where the run's directory goes (``<save_dir>/runs/...``).
* :func:`loggers_elsewhere`: the one line a run prints at its start when a logger of the user's keeps its files outside
  the run's directory (MLflow's store, a logger lfed does not know).
* :func:`finish_wandb_runs`: a W&B run a refused command had started is closed before its files are removed.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from lfed.lightning.checkpoint import read_checkpoint

#: Where the id of the run's W&B run is stored in a checkpoint: a resume continues that W&B run (``resume="allow"``).
WANDB_ID_KEY = "lfed_wandb_run_id"


def wandb_logged_in() -> bool:
    """Whether a W&B API key is configured (environment or ``~/.netrc``), without prompting."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
        return os.path.exists(path) and netrc.netrc(path).authenticators("api.wandb.ai") is not None
    except (netrc.NetrcParseError, OSError):
        return False


def default_logger() -> dict | bool:
    """The default logger config: W&B, offline unless logged in; none when ``WANDB_MODE=disabled``.

    The W&B files go to the run directory (``save_dir`` is filled in per run). With
    ``WANDB_MODE=disabled`` there is no W&B logger at all (so no offline run directory either);
    the metrics CSV is written in both cases.
    """
    if os.environ.get("WANDB_MODE", "").strip().lower() == "disabled":
        return {"class_path": "lfed.lightning.reporting.MetricsCSV", "init_args": {"dirpath": None}}
    return {
        "class_path": "lfed.lightning.reporting.QuietWandbLogger",
        "init_args": {"project": "lfed", "save_dir": None, "offline": not wandb_logged_in()},
    }


def wandb_id(ckpt: str) -> str | None:
    """The W&B run id a checkpoint records (None: none, or not readable here; the fingerprint check says why)."""
    try:
        value = read_checkpoint(ckpt).get(WANDB_ID_KEY)
    except Exception:  # noqa: BLE001 - the checkpoint's own check reports a bad file, with its reason
        return None
    return value if isinstance(value, str) else None


#: The loggers whose files lfed puts inside the run's directory (by their ``save_dir``): W&B's and Lightning's file
#: loggers (a ``CSVLogger`` writes ``<run>/<name>/version_<n>/``, beside lfed's own ``metrics.csv``).
FOLDER_LOGGERS = ("Wandb", "CSVLogger", "TensorBoardLogger")


def _logger_configs(trainer: Any) -> list[Any]:
    """The ``trainer.logger`` settings as a list of ``{class_path, init_args}`` (none for ``false``)."""
    logger = trainer.get("logger") if hasattr(trainer, "get") else None
    return [lg for lg in (logger if isinstance(logger, list) else [logger])
            if hasattr(lg, "get") and lg.get("init_args") is not None]


def _in_run_folder(config: Any) -> bool:
    name = str(config.get("class_path"))
    return any(k in name for k in FOLDER_LOGGERS) and not name.endswith("MetricsCSV")


def logger_root(trainer: Any) -> str | None:
    """Where the run's directory goes when ``trainer.default_root_dir`` is not set: the ``save_dir`` given to the first
    W&B, CSV or TensorBoard logger (``--trainer.logger.save_dir logs``: ``logs/runs/<name>/version_<n>/``), None
    when none is given (the current directory)."""
    for lg in _logger_configs(trainer):
        if _in_run_folder(lg) and lg["init_args"].get("save_dir") not in (None, ""):
            return str(lg["init_args"]["save_dir"])
    return None


def point_loggers_at_run(trainer: Any, run_dir: Path, subcommand: str | None, ckpt_path: Any,
                         root: Path | None = None) -> None:
    """The configured loggers (``trainer``: the command's ``trainer`` settings) write into ``run_dir``: the ``save_dir``
    of W&B, ``CSVLogger`` and ``TensorBoardLogger`` where not given or where it is ``root``, the folder ``run_dir`` was
    made in (:func:`logger_root`), and the metrics CSV's ``dirpath`` where not given; a ``save_dir`` given besides
    ``--trainer.default_root_dir`` stays as given (:func:`loggers_elsewhere` names it). ``lfed fit`` from a checkpoint
    continues the W&B run the checkpoint records."""
    for lg in _logger_configs(trainer):
        init = lg["init_args"]
        given = init.get("save_dir")
        if _in_run_folder(lg) and (given in (None, "") or (root is not None and Path(given).resolve() == Path(root).resolve())):
            init["save_dir"] = str(run_dir)
        if "Wandb" in str(lg.get("class_path")) and subcommand == "fit" and ckpt_path and init.get("id") is None:
            run_id = wandb_id(str(ckpt_path))
            if run_id is not None:  # a resume continues its W&B run, not a new one per resume (issue 51 item 12)
                init["id"], init["resume"] = run_id, "allow"
        if str(lg.get("class_path")).endswith("MetricsCSV") and init.get("dirpath") is None:
            init["dirpath"] = str(run_dir)


def loggers_elsewhere(loggers: Any, run_dir: Path) -> str | None:
    """One line naming the loggers (instantiated) that keep their files outside ``run_dir``, and where; None when every
    logger writes inside it (lfed's own, W&B, CSV, TensorBoard: :func:`point_loggers_at_run`)."""
    run = Path(run_dir).resolve()
    away = []
    for logger in loggers or []:
        save_dir = getattr(logger, "save_dir", None)
        if save_dir is not None and Path(save_dir).resolve().is_relative_to(run):
            continue
        away.append(f"{type(logger).__name__} in {save_dir}" if save_dir else f"{type(logger).__name__} (no local folder)")
    if not away:
        return None
    return (f"lfed: this run's folder is {run_dir} (config.yaml, metrics.csv, checkpoints); "
            f"{', '.join(away)} {'keeps its' if len(away) == 1 else 'keep their'} own files")


def finish_wandb_runs(loggers: Any) -> None:
    """Close the W&B run of each logger that started one (its footer unprinted), so that its files can go."""
    for logger in loggers or []:
        finish = getattr(getattr(logger, "_experiment", None), "finish", None)
        if callable(finish):  # a W&B run that was started: closed (its footer unprinted) before its files go
            import contextlib
            import io

            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    finish(exit_code=1)
            except Exception:  # noqa: BLE001 - the refusal is what the user must see
                pass
