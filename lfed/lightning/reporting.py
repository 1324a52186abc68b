"""What a run leaves behind and shows: its run directory, a metrics CSV, a round table, a round progress bar.

* :func:`config_id` and :func:`run_directory`: every ``lfed`` run writes into its own directory
  ``<root>/runs/<algorithm>-<dataset>-<config id>/version_<n>/`` (checkpoints, ``metrics.csv``,
  ``config.yaml``, the W&B run). The config id is a hash of the run's ``model``, ``data`` and
  ``seed_everything`` settings, so ``--ckpt_path last`` resumes the latest run of the same
  configuration (:func:`latest_checkpoint`) and runs of other configurations never share a file.
* :class:`MetricsCSV`: a Lightning logger that writes every logged metric to ``metrics.csv``, one
  row per round, one column per metric (next to W&B, whose files are binary).
* :class:`RoundTable`: the evaluations of the run (round, test accuracy, test loss, client accuracy
  mean and worst 10%) as a table in the terminal at the end of ``fit``.
* :class:`RoundProgressBar`: a progress bar that counts rounds (``Round 37/100``), not "Epoch 0",
  with no validation bars between its lines during ``fit``.
* :class:`QuietWandbLogger` and :func:`silence_library_noise`: the W&B logger without the
  warning Lightning's ``anonymous=None`` causes, and narrow filters for library messages that
  are not the user's problem (a deprecation inside Lightning, Lightning's advertising tips).
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only

from lfed.base.metric_gate import canonical_name

__all__ = [
    "MetricsCSV",
    "QuietWandbLogger",
    "RoundProgressBar",
    "RoundTable",
    "config_id",
    "describe_optimizer",
    "flat_settings",
    "latest_checkpoint",
    "run_directory",
    "run_name",
    "silence_library_noise",
]

#: Columns of the end-of-run table: (logged metric, header).
TABLE_COLUMNS = (
    ("test/acc", "test acc"),
    ("test/loss", "test loss"),
    ("client/acc_mean", "client acc mean"),
    ("client/acc_worst10pct", "client acc worst 10%"),
    ("personal/acc_mean", "personal acc mean"),  # personalized methods only (docs/algorithms.md §13)
    ("personal/acc_worst10pct", "personal acc worst 10%"),
)


# --------------------------------------------------------------------------- run directories


def config_id(settings: dict[str, Any]) -> str:
    """A short, stable hash (12 hex digits) of a run's settings (a JSON-able dict)."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_name(algorithm: Any, dataset: Any, cid: str) -> str:
    """``<algorithm>-<dataset>-<config id>``, with characters unsafe in a file name replaced."""

    def clean(v: Any) -> str:
        return re.sub(r"[^A-Za-z0-9_.+]+", "_", str(v)).strip("_") or "run"

    return f"{clean(algorithm)}-{clean(dataset)}-{cid}"


def _versions(config_dir: Path) -> list[tuple[int, Path]]:
    if not config_dir.is_dir():
        return []
    out = []
    for p in config_dir.iterdir():
        m = re.fullmatch(r"version_(\d+)", p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def run_directory(config_dir: Path) -> Path:
    """A new ``version_<n>`` directory under ``config_dir`` (created; ``n`` one past the highest)."""
    config_dir.mkdir(parents=True, exist_ok=True)
    n = (_versions(config_dir)[-1][0] + 1) if _versions(config_dir) else 0
    while True:
        path = config_dir / f"version_{n}"
        try:
            path.mkdir()
            return path
        except FileExistsError:  # another process took it
            n += 1


def latest_checkpoint(config_dir: Path) -> Path | None:
    """The most recently written ``checkpoints/last.ckpt`` of the runs under ``config_dir``."""
    found = [p / "checkpoints" / "last.ckpt" for _, p in _versions(config_dir)]
    found = [p for p in found if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def flat_settings(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A run's settings under their config names, for a logger's run config (W&B, ``hparams.yaml``).

    Nested mappings become dotted keys, so the model's and the data's settings of the same name
    stay apart (and match the names a W&B sweep gives its parameters):

    >>> flat_settings({"model": {"seed": 1, "net": {"class_path": "lfed.models.zoo.MLP"}}, "data": {"seed": 0},
    ...                "seed_everything": 0})
    {'model.seed': 1, 'model.net.class_path': 'lfed.models.zoo.MLP', 'data.seed': 0, 'seed_everything': 0}
    """
    out: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_settings(value, name + "."))
        else:
            out[name] = value
    return out


def describe_optimizer(factory: Any) -> str:
    """``SGD(lr=1.0, momentum=0.0)``: the class and the settings of the optimizer ``factory`` builds."""
    import torch

    try:
        opt = factory([torch.zeros(1, requires_grad=True)])
    except Exception:  # noqa: BLE001 - a factory that needs the real parameters
        return getattr(factory, "__qualname__", repr(factory))
    keys = ("lr", "momentum", "nesterov", "betas", "eps", "tau", "weight_decay")
    hp = ", ".join(f"{k}={opt.defaults[k]}" for k in keys if k in opt.defaults and opt.defaults[k] not in (None, False))
    return f"{type(opt).__name__}({hp})"


# --------------------------------------------------------------------------- metrics CSV


class MetricsCSV(Logger):
    """Every logged metric in ``<dirpath>/metrics.csv``: one row per step, one column per metric.

    Rows are keyed by the step the metrics were logged at (Lightning's ``step``, the same as
    W&B's: the 0-based index ``r`` of the round whose metrics they are; an evaluation after round
    ``r`` is in row ``r``); the ``rounds_done`` column is ``r + 1``. The file is rewritten
    atomically every ``flush_every`` log calls and at the end of the run. An existing file is
    read first, so a resumed run continues it (its rows from the resumed round on replace
    those a killed run logged after its last checkpoint).

    Args:
        dirpath: Directory of the file (created when the first row is written); None: the current
            directory. ``lfed`` fills in the run directory.
        flush_every: Log calls between writes of the file.
    """

    def __init__(self, dirpath: str | os.PathLike | None = None, flush_every: int = 10) -> None:
        super().__init__()
        self.path = Path(dirpath if dirpath is not None else os.getcwd()) / "metrics.csv"
        self.flush_every = flush_every
        self._rows: dict[int, dict[str, float]] = {}  # Lightning's step -> metrics
        self._pending = 0
        self._first_step: int | None = None
        if self.path.is_file():
            with open(self.path, newline="") as f:
                for row in csv.DictReader(f):
                    step = int(row.pop("step"))
                    row.pop("rounds_done", None)
                    self._rows[step] = {k: float(v) for k, v in row.items() if v not in ("", None)}

    @property
    def name(self) -> str:
        return "metrics_csv"

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> str:
        return str(self.path.parent)

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Hyperparameters are in the run's ``config.yaml``; nothing to do here."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Record ``metrics`` under round ``step``."""
        step = int(step or 0)
        if self._first_step is None:  # a resumed run replaces what a killed run logged after its checkpoint
            self._first_step = step
            for s in [s for s in self._rows if s >= step]:
                del self._rows[s]
        row = self._rows.setdefault(step, {})
        for k, v in metrics.items():
            if k == "epoch":
                continue
            row[k] = float(v.item() if hasattr(v, "item") else v)
        self._pending += 1
        if self._pending >= self.flush_every:
            self.save()

    @rank_zero_only
    def save(self) -> None:
        """Write the file (atomically: a temporary file renamed over it)."""
        if not self._rows:
            return
        self._pending = 0
        keys = sorted({k for row in self._rows.values() for k in row})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "rounds_done", *keys])
            for step in sorted(self._rows):
                row = self._rows[step]
                w.writerow([step, step + 1, *(repr(row[k]) if k in row else "" for k in keys)])
        os.replace(tmp, self.path)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.save()


# --------------------------------------------------------------------------- end-of-run table


class RoundTable(Callback):
    """Print the run's evaluations as a table at the end of ``fit`` (rank 0).

    After every evaluation of the global model it records the number of rounds done
    (``global_step``) and the logged ``test/acc``, ``test/loss``, ``client/acc_mean`` and
    ``client/acc_worst10pct`` (and ``personal/acc_mean``, ``personal/acc_worst10pct`` of a personalized
    method); the rows are part of the checkpoint, so a resumed run prints the
    whole history. At most ``max_rows`` rows are printed (evenly spaced, the last one always).

    Args:
        max_rows: Most rows to print.
    """

    def __init__(self, max_rows: int = 20) -> None:
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 2:
            raise ValueError(f"max_rows: must be an int >= 2, got {max_rows!r}")
        self.max_rows = max_rows
        self.rows: list[dict[str, float]] = []

    def on_validation_end(self, trainer: Trainer, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        row = {"round": float(trainer.global_step)}
        for key, _ in TABLE_COLUMNS:
            if key in metrics:
                row[key] = float(metrics[key])
        if len(row) == 1:
            return
        self.rows = [r for r in self.rows if r["round"] != row["round"]] + [row]

    def table(self) -> str:
        """The table as text ('' without evaluations)."""
        if not self.rows:
            return ""
        rows = self.rows
        if len(rows) > self.max_rows:
            pick = sorted({round(i * (len(rows) - 1) / (self.max_rows - 1)) for i in range(self.max_rows)})
            rows = [rows[i] for i in pick]
        cols = [(k, h) for k, h in TABLE_COLUMNS if any(k in r for r in rows)]
        header = ["rounds done", *(h for _, h in cols)]
        body = [[f"{int(r['round'])}", *(f"{r[k]:.4f}" if k in r and math.isfinite(r[k]) else "-" for k, _ in cols)] for r in rows]
        widths = [max(len(x) for x in col) for col in zip(header, *body)]
        line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
        skipped = f" ({len(self.rows)} evaluations, {len(rows)} shown)" if len(rows) < len(self.rows) else ""
        return "\n".join([f"lfed: evaluations of the global model{skipped}", line(header), *map(line, body)])

    @rank_zero_only
    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        self._trained = True

    @rank_zero_only
    def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
        text = self.table()
        if text:
            print(text, flush=True)

    @rank_zero_only
    def on_fit_end(self, trainer: Trainer, pl_module: Any) -> None:
        """A resumed run that had already trained every round (Lightning skips training and says only "max_steps
        reached"): say so, and show its evaluations (issue 51 item 12)."""
        if getattr(self, "_trained", False):
            return
        print(f"lfed: the checkpoint had already trained all {int(trainer.global_step)} rounds of this run; nothing was "
              "trained (give a larger --trainer.max_steps to train on)", flush=True)
        text = self.table()
        if text:
            print(text, flush=True)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [dict(r) for r in self.rows]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # a checkpoint of lfed <= 0.4 holds its rows under the metrics' old names (client/acc_worst10)
        self.rows = [{canonical_name(k): v for k, v in r.items()} for r in state_dict.get("rows", [])]


# --------------------------------------------------------------------------- progress bar


class RoundProgressBar(TQDMProgressBar):
    """Lightning's tqdm progress bar counting rounds: ``Round 37/100``, not ``Epoch 0``.

    The bar's position is ``global_step`` (rounds done, also after a resume) and its total
    is ``trainer.max_steps``. During ``fit`` it draws no bar for the evaluations of the global
    model (nor for a sanity check): they take a moment each and their "Validation DataLoader 0"
    lines would interleave with the round bar, whose postfix shows the evaluation's
    ``test/acc``. ``lfed validate``/``lfed test`` keep their bar.
    """

    def _rounds_total(self, trainer: Trainer) -> int | None:
        return trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None

    def init_sanity_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)  # Lightning's own stand-in for a bar that is not drawn

    def init_validation_tqdm(self) -> Tqdm:
        if self.trainer.state.fn == TrainerFn.FITTING:
            return Tqdm(disable=True)
        return super().init_validation_tqdm()

    def init_train_tqdm(self):
        bar = super().init_train_tqdm()
        bar.set_description("Round")
        return bar

    def on_train_epoch_start(self, trainer: Trainer, *args: Any) -> None:
        bar = self.train_progress_bar
        bar.reset(total=self._rounds_total(trainer))
        bar.initial = 0
        bar.n = trainer.global_step
        bar.set_description("Round")
        bar.refresh()

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        bar = self.train_progress_bar
        if bar is None or bar.disable:
            return
        bar.n = trainer.global_step
        bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
        bar.refresh()


# --------------------------------------------------------------------------- noise


class QuietWandbLogger(WandbLogger):
    """Lightning's ``WandbLogger`` without W&B's "The anonymous setting has no effect" warning.

    Lightning passes ``anonymous=None`` to ``wandb.init`` when ``anonymous`` is not set, and
    W&B (>= 0.19) warns about any value given for that deprecated setting. This logger leaves
    the key out when it is None; everything else is Lightning's ``WandbLogger``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Lightning keeps wandb.init's arguments in the private ``_wandb_init`` dict and offers no
        # public way to leave a key out; tests/lightning/test_first_hour_cli.py fails if it is renamed.
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)


class _DropLightningTips(logging.Filter):
    """Drops Lightning's "💡 Tip: ... litlogger / litmodels" advertisements, nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (msg.startswith("💡 Tip:") and ("litlogger" in msg or "litmodels" in msg))


def silence_library_noise() -> None:
    """Install narrow filters for library messages that are not the user's problem (idempotent).

    * torch's deprecation warning about ``isinstance(treespec, LeafSpec)``, raised from
      Lightning's own ``lightning.pytorch.utilities._pytree`` (only from that module);
    * Lightning's "💡 Tip" advertisements for ``litlogger`` and ``litmodels`` (its
      ``lightning.pytorch.utilities.rank_zero`` log records that start with the tip and name one).
    """
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", module=r"lightning\.pytorch\.utilities\._pytree"
    )
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropLightningTips) for f in log.filters):
            log.addFilter(_DropLightningTips())
