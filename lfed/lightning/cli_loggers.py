"""The loggers of ``lfed fit|validate|test`` (:mod:`lfed.lightning.cli`): Weights & Biases by default, in the run directory.

* :func:`default_logger`: W&B, online when the user is logged in (:func:`wandb_logged_in`), offline otherwise;
  ``WANDB_MODE=disabled`` turns W&B off (the metrics CSV is still written).
* :func:`point_loggers_at_run`: the W&B files and the metrics CSV go to the run's directory, and a resumed run continues
  its W&B run (the id its checkpoint records under :data:`WANDB_ID_KEY`: :func:`wandb_id`).
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


def point_loggers_at_run(trainer: Any, run_dir: Path, subcommand: str | None, ckpt_path: Any) -> None:
    """The configured loggers (``trainer``: the command's ``trainer`` settings) write into ``run_dir``: W&B's
    ``save_dir`` and the metrics CSV's ``dirpath``, where not given; ``lfed fit`` from a checkpoint continues the W&B
    run the checkpoint records."""
    logger = trainer.get("logger")
    for lg in logger if isinstance(logger, list) else [logger]:
        init = lg.get("init_args") if hasattr(lg, "get") else None
        if init is None:
            continue
        if "Wandb" in str(lg.get("class_path")) and init.get("save_dir") is None:
            init["save_dir"] = str(run_dir)
        if "Wandb" in str(lg.get("class_path")) and subcommand == "fit" and ckpt_path and init.get("id") is None:
            run_id = wandb_id(str(ckpt_path))
            if run_id is not None:  # a resume continues its W&B run, not a new one per resume (issue 51 item 12)
                init["id"], init["resume"] = run_id, "allow"
        if str(lg.get("class_path")).endswith("MetricsCSV") and init.get("dirpath") is None:
            init["dirpath"] = str(run_dir)


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
