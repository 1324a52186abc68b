"""Lightning callbacks for what a federated run shows beyond scalars (docs/architecture.md: lightning/).

* :class:`AttentionHeatmap`: the IGFL-S attention matrix as a heatmap every N rounds, the last
  round's and the running mean over all rounds so far (000 Fig. 2 averages 1,000 rounds), with
  rows and columns labelled by client id.
* :class:`CommunicationCost`: the per-round communication record (uploads, bits up and down,
  docs/algorithms.md §5 and §7) as a table: a W&B table when a :class:`~lightning.pytorch.loggers.WandbLogger`
  is attached, and a CSV file.

Both work with any logger: images and tables go to W&B when a ``WandbLogger`` is attached and
to files under the trainer's log directory otherwise (or always, under ``dirpath``). Figures are
drawn with matplotlib's Agg canvas (no display, no ``pyplot`` global state). Only rank 0 draws
and writes.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from lfed.checks import integer

__all__ = ["AttentionHeatmap", "CommunicationCost", "color_range", "render_attention"]


def _check_every(every_n_rounds: Any) -> int:
    return integer("every_n_rounds", every_n_rounds, at_least=1)


def _wandb_loggers(trainer: Trainer) -> list:
    from lightning.pytorch.loggers import WandbLogger

    return [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]


def _log_dir(trainer: Trainer, dirpath: str | None, sub: str) -> Path:
    """``dirpath``, or ``<trainer.log_dir>/<sub>`` (call on every rank: log_dir broadcasts)."""
    if dirpath is not None:
        return Path(dirpath)
    base = trainer.log_dir or trainer.default_root_dir
    return Path(base) / sub


def render_attention(
    matrix: np.ndarray,
    row_labels: list[str],
    col_labels: list[str],
    title: str,
    *,
    row_title: str = "query: client",
    col_title: str = "key: client",
    cmap: str = "viridis",
    annotate: bool | None = None,
    blank_note: str = "blank: clients never in a cohort together",
):
    """Draw an attention matrix as a heatmap (000 Fig. 2).

    The colour scale spans the data's range (its smallest to its largest finite value), not
    ``[0, max]``: attention weights of a cohort are often close to each other (a mean over many
    rounds even more so), and a scale from 0 would draw them all in one colour.

    Args:
        matrix: ``[R, K]`` attention scores; NaN cells (pairs never seen together) stay blank,
            and the figure then says so under the axes (``blank_note``).
        row_labels: ``R`` labels of the query rows (client ids).
        col_labels: ``K`` labels of the key columns (client ids).
        title: Figure title.
        row_title: Label of the row axis.
        col_title: Label of the column axis.
        cmap: matplotlib colormap name.
        annotate: Write each cell's value in it; default: when the matrix has at most 12 columns
            and 12 rows.
        blank_note: Caption explaining blank (NaN) cells, shown when there are any.

    Returns:
        A ``matplotlib.figure.Figure`` with an Agg canvas attached (``fig.savefig`` works, and
        ``fig.canvas.buffer_rgba()`` after ``fig.canvas.draw()``).

    Raises:
        ValueError: If the labels do not match the matrix shape.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape != (len(row_labels), len(col_labels)):
        raise ValueError(
            f"matrix: shape {matrix.shape} does not match {len(row_labels)} row and {len(col_labels)} column labels"
        )
    rows, cols = matrix.shape
    if annotate is None:
        annotate = rows <= 12 and cols <= 12
    width = min(16.0, max(4.5, 0.45 * cols + 2.5))
    height = min(16.0, max(2.2, 0.45 * rows + 1.8))
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    vmin, vmax = color_range(matrix)
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                      interpolation="nearest")
    fig.colorbar(image, ax=ax, label="attention α")
    step_c = max(1, math.ceil(cols / 40))
    step_r = max(1, math.ceil(rows / 40))
    ax.set_xticks(range(0, cols, step_c), [col_labels[i] for i in range(0, cols, step_c)],
                  rotation=90 if cols > 12 else 0, fontsize=8)
    ax.set_yticks(range(0, rows, step_r), [row_labels[i] for i in range(0, rows, step_r)], fontsize=8)
    ax.set_xlabel(col_title)
    ax.set_ylabel(row_title)
    ax.set_title(title, fontsize=10)
    if annotate:
        for i in range(rows):
            for j in range(cols):
                if np.isfinite(matrix[i, j]):
                    ax.text(j, i, f"{matrix[i, j]:.3g}", ha="center", va="center", fontsize=7,
                            color="white" if matrix[i, j] < vmin + 0.6 * (vmax - vmin) else "black")
    has_blank = bool((~np.isfinite(matrix)).any())
    if has_blank:
        ax.set_facecolor("white")
        fig.text(0.01, 0.01, blank_note, fontsize=8, ha="left", va="bottom", style="italic")
    fig.tight_layout(rect=(0, 0.05, 1, 1) if has_blank else None)
    return fig


def color_range(matrix: np.ndarray) -> tuple[float, float]:
    """The colour scale ``(vmin, vmax)`` of a heatmap: the range of its finite values.

    A constant matrix gets a small band around its value; one with no finite value ``(0, 1)``.
    """
    finite = np.asarray(matrix, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if not finite.size:
        return 0.0, 1.0
    lo, hi = float(finite.min()), float(finite.max())
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        pad = 0.05 * max(abs(hi), 1e-3)
        return lo - pad, hi + pad
    return lo, hi


def _figure_rgba(fig) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba()).copy()


def _one_row(result) -> bool:
    """Whether the attention has one query row (global, and time with softmax weights)."""
    return result.matrix.shape[0] == 1


class AttentionHeatmap(Callback):
    """Heatmaps of IGFL-S attention (docs/algorithms.md §4; 000 Algorithm 3 and Fig. 2).

    After every round that used attention the callback adds the round's ``α`` (from
    the run's ``last_round.attention``, rows = queries, columns = keys, labelled by
    its cohort's clients) to a running sum over client pairs. Every
    ``every_n_rounds`` rounds (and at the end of training) it draws

    * ``attention/last``: the matrix of the last round, over that round's counting clients, and
    * ``attention/mean`` (with ``average=True``): the mean of ``α_ij`` over the rounds in which
      clients ``i`` and ``j`` were both in the cohort, over every client seen so far, as in 000
      Fig. 2 ("the average of all scores"). Pairs never seen together are blank.

    ``self`` and ``time`` with ``time_weights: diagonal`` give ``[clients × clients]`` matrices
    (for ``time`` row ``i`` is the query of client ``i``'s previous update); ``global`` gives one
    row (the cohort's mean update as query), and so does ``time`` with softmax weights (one
    softmax over the clients' similarities to their own previous update).

    Images go to W&B through ``WandbLogger.log_image`` when such a logger is attached; otherwise
    they are written as PNG files ``attention_last_round00010.png`` /
    ``attention_mean_round00010.png`` (round 10 = after ten rounds, as in the figures' titles)
    under ``dirpath`` (default ``<trainer.log_dir>/attention``).
    With ``dirpath`` set, files are written in either case. A module that does not use attention
    (``aggregation: mean``) gets one warning and no images.

    Args:
        every_n_rounds: Draw after every this many rounds (>= 1).
        average: Also draw the running mean over rounds.
        dirpath: Folder for the PNG files (always written when given).
        cmap: matplotlib colormap.
        run: In a grid, the name of the run to draw (None: the first run).

    Raises:
        ValueError: If ``every_n_rounds`` is not an int >= 1.

    Example (YAML)::

        trainer:
          callbacks:
            - class_path: lfed.lightning.callbacks.AttentionHeatmap
              init_args: {every_n_rounds: 50}
    """

    def __init__(self, every_n_rounds: int = 50, average: bool = True, dirpath: str | None = None,
                 cmap: str = "viridis", run: str | None = None) -> None:
        self.every_n_rounds = _check_every(every_n_rounds)
        self.run = run
        self.average = bool(average)
        self.dirpath = dirpath
        self.cmap = cmap
        self.sums: np.ndarray | None = None  # [N_rows, N] float64 (1 row for global attention)
        self.counts: np.ndarray | None = None
        self.query: str | None = None
        self.rounds_seen = 0
        self.last_drawn: int | None = None
        self.written: list[Path] = []
        self._dir: Path | None = None
        self._warned = False

    # ------------------------------------------------------------------ accumulation
    def add(self, result, clients: torch.Tensor, num_clients: int) -> None:
        """Add one round's attention to the running mean.

        Args:
            result: The round's :class:`~lfed.server.attention.AttentionResult`.
            clients: ``[K]`` client ids of the cohort, in the order of ``result``'s rows/columns.
            num_clients: ``N``, all clients.
        """
        matrix = result.matrix.detach().double().cpu().numpy()
        ids = clients.detach().cpu().numpy().astype(np.int64)
        kept = (result.mask.detach().cpu().numpy().astype(bool) if result.mask is not None
                else np.ones(ids.size, dtype=bool))
        rows = 1 if _one_row(result) else num_clients
        if self.sums is None or self.sums.shape != (rows, num_clients) or self.query != result.query:
            self.sums = np.zeros((rows, num_clients))
            self.counts = np.zeros((rows, num_clients))
            self.query = result.query
        cols = ids[kept]
        if rows == 1:
            np.add.at(self.sums, (np.zeros_like(cols), cols), matrix[0, kept])
            np.add.at(self.counts, (np.zeros_like(cols), cols), 1.0)
        else:
            sub = matrix[np.ix_(kept, kept)]
            r_idx, c_idx = np.meshgrid(cols, cols, indexing="ij")
            np.add.at(self.sums, (r_idx, c_idx), sub)
            np.add.at(self.counts, (r_idx, c_idx), 1.0)
        self.rounds_seen += 1

    def mean_matrix(self) -> tuple[np.ndarray, list[int], list[int]]:
        """The running mean of ``α`` over the clients seen so far.

        Returns:
            ``(matrix, row_ids, col_ids)``; cells of pairs never seen together are NaN. For
            global attention the single row has id -1.
        """
        if self.sums is None:
            raise ValueError("no attention has been recorded yet")
        seen = np.flatnonzero(self.counts.sum(axis=0) > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(self.counts > 0, self.sums / np.maximum(self.counts, 1), np.nan)
        if self.sums.shape[0] == 1:
            return mean[:, seen], [-1], seen.tolist()
        return mean[np.ix_(seen, seen)], seen.tolist(), seen.tolist()

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._dir = _log_dir(trainer, self.dirpath, "attention")

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        finished = int(trainer.global_step) - 1  # the round that just ran
        run = _watched_run(pl_module, self.run)
        rec = run.last_round
        if rec is None or rec.attention is None or rec.round != finished:
            if not self._warned and run.composition.get("aggregation", "mean") == "mean":
                rank_zero_warn("AttentionHeatmap: the module's aggregation is 'mean' (no attention); no heatmaps")
                self._warned = True
            return
        self.add(rec.attention, rec.cohort.clients, int(run.data.num_clients))
        if (finished + 1) % self.every_n_rounds == 0:
            self.draw(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.rounds_seen and self.last_drawn != int(trainer.global_step):
            self.draw(trainer, pl_module)

    def draw(self, trainer: Trainer, pl_module: LightningModule) -> list[np.ndarray]:
        """Draw (and log or write) the current heatmaps; returns their RGBA arrays (rank 0)."""
        step = int(trainer.global_step)
        self.last_drawn = step
        if not trainer.is_global_zero:
            return []
        images: list[tuple[str, str, Any]] = []
        rec = _watched_run(pl_module, self.run).last_round
        result = rec.attention
        query = result.query
        kept = (result.mask.detach().cpu().numpy().astype(bool) if result.mask is not None
                else np.ones(result.matrix.shape[1], dtype=bool))
        ids = rec.cohort.clients.detach().cpu().numpy()[kept].tolist()
        matrix = result.matrix.detach().double().cpu().numpy()
        one_row = _one_row(result)
        matrix = matrix[:, kept] if one_row else matrix[np.ix_(kept, kept)]
        rows = {"global": ["mean Δ"], "time": ["own previous Δ"]}.get(query, []) if one_row else [str(i) for i in ids]
        row_title = {"self": "query: client Δ", "global": "query", "time": "query: client's previous Δ"}[query]
        # titles count rounds as the file names do: "round 20" is the 20th round (global step 20)
        done = rec.round + 1
        fig = render_attention(
            matrix, rows, [str(i) for i in ids],
            f"{query}-attention, round {done} (entropy {float(result.entropy):.3f} nats)",
            row_title=row_title, col_title="key: client Δ", cmap=self.cmap,
        )
        images.append(("last", "attention/last", fig))
        if self.average:
            mean, row_ids, col_ids = self.mean_matrix()
            fig = render_attention(
                mean, ["mean Δ"] if query == "global" else [str(i) for i in row_ids], [str(i) for i in col_ids],
                f"{query}-attention, mean over {self.rounds_seen} rounds (to round {step})",
                row_title=row_title, col_title="key: client Δ", cmap=self.cmap,
            )
            images.append(("mean", "attention/mean", fig))
        wandb = _wandb_loggers(trainer)
        arrays = []
        for name, key, fig in images:
            rgba = _figure_rgba(fig)
            arrays.append(rgba)
            for logger in wandb:
                logger.log_image(key=key, images=[rgba[..., :3]], step=step)
            if self.dirpath is not None or not wandb:
                self._dir.mkdir(parents=True, exist_ok=True)
                path = self._dir / f"attention_{name}_round{step:05d}.png"
                fig.savefig(path)
                self.written.append(path)
        return arrays

    def state_dict(self) -> dict[str, Any]:
        return {"sums": self.sums, "counts": self.counts, "query": self.query, "rounds_seen": self.rounds_seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.sums, self.counts = state_dict["sums"], state_dict["counts"]
        self.query, self.rounds_seen = state_dict["query"], state_dict["rounds_seen"]


def _watched_run(pl_module: LightningModule, name: str | None):
    """The run a callback watches: the one named ``name`` of the module's runs (None: the first)."""
    runs = list(pl_module.runs)
    if name is None:
        return runs[0]
    for run in runs:
        if run.name == name:
            return run
    raise ValueError(f"run: no run named {name!r}; the runs are {[r.name for r in runs]}")


class CommunicationCost(Callback):
    """Per-round communication record as a table (docs/algorithms.md §5 uploads, docs/algorithms.md §7 bits).

    After each round it reads the run's ``comm`` (:class:`~lfed.evaluation.communication.CommunicationMeter`)
    and keeps one row: ``round, uploads, uploads_total, bits_up, bits_down, bits_up_total,
    bits_down_total, megabytes_total`` (bits up + down, in 10^6 bytes). At the end of training
    (and every ``every_n_rounds`` rounds, if given) it writes ``communication.csv`` under
    ``dirpath`` (default ``<trainer.log_dir>``) and logs the table to W&B when a ``WandbLogger``
    is attached.

    The realised uploads are an un-noised count of the clients: a DP run (:mod:`lfed.base.metric_gate`) keeps no table
    by default, and with ``log_unaccounted`` logs it to W&B as ``unaccounted/<key>``.

    Args:
        every_n_rounds: Also write/log the table every this many rounds (None: at the end only).
        dirpath: Folder of the CSV file.
        key: W&B table key.
        run: In a grid, the name of the run to record (None: the first run).

    Raises:
        ValueError: If ``every_n_rounds`` is given and not an int >= 1.
    """

    COLUMNS = ["round", "uploads", "uploads_total", "bits_up", "bits_down", "bits_up_total",
               "bits_down_total", "megabytes_total"]

    def __init__(self, every_n_rounds: int | None = None, dirpath: str | None = None,
                 key: str = "comm/table", run: str | None = None) -> None:
        self.every_n_rounds = None if every_n_rounds is None else _check_every(every_n_rounds)
        self.run = run
        self.dirpath = dirpath
        self.key = key
        self.rows: list[list[float]] = []
        self.path: Path | None = None
        self._dir: Path | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._dir = _log_dir(trainer, self.dirpath, "")

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        run = _watched_run(pl_module, self.run)
        self._shown_key = run.metric_gate.name(self.key)  # under DP: None (not kept) or unaccounted/<key>
        if self._shown_key is None:
            return
        comm = run.comm
        if self.rows and self.rows[-1][0] == comm.rounds:
            return
        self.rows.append([
            comm.rounds, comm.round_uploads, comm.uploads, comm.round_bits_up, comm.round_bits_down,
            comm.bits_up, comm.bits_down, (comm.bits_up + comm.bits_down) / 8e6,
        ])
        if self.every_n_rounds is not None and comm.rounds % self.every_n_rounds == 0:
            self.write(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.write(trainer)

    def write(self, trainer: Trainer) -> Path | None:
        """Write the CSV (and log the W&B table); returns the CSV path on rank 0."""
        if not trainer.is_global_zero or not self.rows:
            return None
        self._dir.mkdir(parents=True, exist_ok=True)
        self.path = self._dir / "communication.csv"
        with open(self.path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(self.COLUMNS)
            writer.writerows(self.rows)
        for logger in _wandb_loggers(trainer):
            logger.log_table(key=getattr(self, "_shown_key", None) or self.key, columns=self.COLUMNS,
                             data=[list(r) for r in self.rows])
        return self.path

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [list(r) for r in self.rows]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = [list(r) for r in state_dict["rows"]]
