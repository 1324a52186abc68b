"""``lfed plot``: the curves of several runs, read from their ``metrics.csv``, drawn into one PNG (no account, no W&B).

Every run writes ``metrics.csv`` into its run directory (``lfed fit``: ``runs/<name>/version_<n>/metrics.csv``; ``lfed
grid``: ``grids/<sweep>-<id>/<run>/metrics.csv``): one row per round, ``step`` (the 0-based round) and ``rounds_done``
(``step + 1``) first, then one column per logged metric (``test/acc``, ``test/loss``, ``clock/time``, ...), empty
where the metric was not logged that round. :func:`find_runs` turns what the user names (a ``metrics.csv``, a run
directory, or a folder above runs such as ``runs/``) into the files, :func:`read_metrics` reads one, and
:func:`plot_runs` draws the chosen metrics of all of them, one panel per metric and one line per run, on matplotlib's
Agg canvas (no display, no ``pyplot`` state).

Reads only CSV files: nothing here imports torch or Lightning, so ``lfed plot`` starts in well under a second.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["PlotError", "X_AXES", "find_runs", "main", "parser", "plot_runs", "read_metrics", "run_labels"]

#: The x axes with a name of their own: ``round`` is ``rounds_done`` (rounds trained when the row was logged), ``step``
#: the 0-based round. Any other column of the files (``clock/time``, ``comm/uploads``, ...) may be named as it is.
X_AXES = {"round": "rounds_done", "step": "step"}

#: The file every run writes (:class:`lfed.lightning.reporting.MetricsCSV`).
METRICS_FILE = "metrics.csv"


class PlotError(ValueError):
    """A mistake in what ``lfed plot`` was asked to draw: one line naming the argument and what is there."""


def find_runs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The ``metrics.csv`` files of ``paths``, in the order given: a file itself, a run directory's own
    ``metrics.csv``, or every ``metrics.csv`` under a folder of runs (sorted); each file once.

    Raises:
        PlotError: A path that does not exist, or a folder with no ``metrics.csv`` in or under it.
    """
    if not paths:
        raise PlotError("runs: name at least one run directory, metrics.csv or folder of runs (e.g. runs/)")
    out: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_file():
            found = [path]
        elif path.is_dir():
            found = [path / METRICS_FILE] if (path / METRICS_FILE).is_file() else sorted(path.rglob(METRICS_FILE))
            if not found:
                raise PlotError(f"runs: no {METRICS_FILE} in or under {given} (a run writes one into its run directory, "
                                "runs/<name>/version_<n>/)")
        else:
            raise PlotError(f"runs: {given} does not exist")
        out += [f for f in found if f.resolve() not in {o.resolve() for o in out}]
    return out


def read_metrics(path: str | os.PathLike) -> dict[str, list[float]]:
    """The columns of a ``metrics.csv``: ``{column: values}``, every column as long as the file has rows, NaN where
    a row has no value.

    Raises:
        PlotError: A file that is not a metrics CSV (no ``step`` column) or holds a value that is not a number.
    """
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns = list(reader.fieldnames or [])
        if "step" not in columns:
            raise PlotError(f"runs: {path} is not a run's {METRICS_FILE} (it has no 'step' column; its columns: "
                            f"{', '.join(columns) or 'none'})")
        out: dict[str, list[float]] = {c: [] for c in columns}
        for line, row in enumerate(reader, start=2):
            for c in columns:
                value = row.get(c)
                try:
                    out[c].append(float(value) if value not in ("", None) else math.nan)
                except ValueError:
                    raise PlotError(f"runs: {path}, line {line}, column {c}: {value!r} is not a number") from None
    if "rounds_done" not in out:  # a file written by hand or by another logger: rounds done is step + 1
        out["rounds_done"] = [s + 1 for s in out["step"]]
    return out


def run_labels(files: Sequence[Path]) -> list[str]:
    """A short label per run: its run directory relative to the folder all the runs share (``fedprox-digits-<id>``),
    with ``/version_<n>`` kept only where two runs of the list share the rest."""
    dirs = [f.resolve().parent for f in files]
    if len(dirs) == 1:
        d = dirs[0]
        return [d.parent.name if d.name.startswith("version_") else d.name]
    common = Path(os.path.commonpath([str(d) for d in dirs]))
    rel = [d.relative_to(common).as_posix() or d.name for d in dirs]
    heads = [r.rsplit("/", 1)[0] if r.rsplit("/", 1)[-1].startswith("version_") and "/" in r else r for r in rel]
    return [h if heads.count(h) == 1 else r for h, r in zip(heads, rel)]


def _never_decreases(values: Sequence[float]) -> bool:
    """Whether a column can be an x axis: logged every round, never decreasing, and growing (``comm/uploads_total``,
    ``clock/time``)."""
    return len(values) > 1 and not any(math.isnan(v) for v in values) and all(a <= b for a, b in zip(values, values[1:])) \
        and values[-1] > values[0]


def _metric_columns(columns: Sequence[str]) -> list[str]:
    return [c for c in columns if c not in ("step", "rounds_done")]


def _check_axes(tables: list[dict[str, list[float]]], labels: Sequence[str], metrics: Sequence[str], x: str) -> str:
    """The column of ``x`` (:data:`X_AXES`); an error naming what the runs have when a metric is in none of them or
    the x axis is missing from one."""
    have = sorted({c for t in tables for c in _metric_columns(list(t))})
    unknown = [m for m in metrics if not any(m in t for t in tables)]
    if unknown:
        raise PlotError(f"metric: {', '.join(unknown)} is in no run's {METRICS_FILE}; the runs have: {', '.join(have) or 'none'}")
    column = X_AXES.get(x, x)
    lacking = [lab for lab, t in zip(labels, tables) if column not in t]
    if lacking:
        shared = sorted(set.intersection(*(set(t) for t in tables)) - {"step", "rounds_done"})
        growing = [c for c in shared if all(_never_decreases(t[c]) for t in tables)]  # what can be an x axis
        raise PlotError(f"x: {x!r} is not a column of {', '.join(lacking)}; the x axes these runs have are round, step"
                        f"{''.join(', ' + c for c in growing)}")
    return column


def plot_runs(
    runs: Sequence[str | os.PathLike],
    metrics: Sequence[str] = ("test/acc",),
    x: str = "round",
    output: str | os.PathLike | None = "curves.png",
    labels: Sequence[str] | None = None,
) -> Any:
    """Draw ``metrics`` of every run of ``runs`` against ``x`` into one figure: one panel per metric, one line per run.

    Args:
        runs: Run directories, ``metrics.csv`` files or folders of runs (:func:`find_runs`).
        metrics: Columns to draw (``test/acc``, ``test/loss``, ``client/acc_mean``, ...). A run that lacks one is left
            out of that panel (the figure's ``lfed_missing`` lists it); a metric no run has is an error.
        x: ``round`` (rounds done), ``step`` (the 0-based round) or any column the runs share (``clock/time``).
        output: The PNG to write (its folder is created); None: write nothing.
        labels: One legend label per run found (default: :func:`run_labels`).

    Returns:
        The ``matplotlib.figure.Figure`` (an Agg canvas attached). Its attribute ``lfed_series`` is
        ``{metric: [run labels drawn]}`` and ``lfed_missing`` ``{metric: [run labels without it]}``.

    Raises:
        PlotError: An unknown metric or x axis (the message lists the columns the runs have), labels that do not match
            the runs, no metric given, or matplotlib not installed.
    """
    files = find_runs(runs)
    if not metrics:
        raise PlotError("metric: name at least one metric (--metric test/acc)")
    if labels is None:
        labels = run_labels(files)
    elif len(labels) != len(files):
        raise PlotError(f"label: {len(labels)} labels given for {len(files)} runs ({', '.join(map(str, files))})")
    tables = [read_metrics(f) for f in files]
    column = _check_axes(tables, labels, metrics, x)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise PlotError(f"lfed plot draws with matplotlib, which does not import here ({err}): pip install matplotlib") from err

    fig = Figure(figsize=(7.5, 0.6 + 3.2 * len(metrics)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    series: dict[str, list[str]] = {}
    missing: dict[str, list[str]] = {}
    for ax, metric in zip(axes, metrics):
        for label, table in zip(labels, tables):
            if metric not in table:
                missing.setdefault(metric, []).append(label)
                continue
            points = [(a, b) for a, b in zip(table[column], table[metric]) if not math.isnan(a) and not math.isnan(b)]
            if not points:
                missing.setdefault(metric, []).append(label)
                continue
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o" if len(points) <= 30 else None, markersize=3, label=label)
            series.setdefault(metric, []).append(label)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
        if series.get(metric):
            ax.legend(fontsize=8)
    axes[-1].set_xlabel({"round": "rounds done", "step": "round (0-based)"}.get(x, x))
    if x in X_AXES:
        from matplotlib.ticker import MaxNLocator

        axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    fig.lfed_series, fig.lfed_missing = series, missing
    if output is not None:
        out = Path(output)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
    return fig


def parser() -> argparse.ArgumentParser:
    """``lfed plot``'s arguments."""
    p = argparse.ArgumentParser(
        prog="lfed plot",
        description="Draw the curves of several runs from their metrics.csv into one PNG: one panel per metric, one "
        "line per run (no account needed; the W&B files are not read).",
        epilog="example: lfed plot runs/ --metric test/acc --metric test/loss -o compare.png",
    )
    p.add_argument("runs", nargs="+", help="run directories (runs/<name>/version_<n>), metrics.csv files, or folders of "
                   "runs: every metrics.csv under them (runs/, a grid's grids/<sweep>-<id>/)")
    p.add_argument("--metric", "-m", action="append", default=None,
                   help="a column of metrics.csv to draw, repeatable (default: test/acc)")
    p.add_argument("--x", default="round", help="the x axis: round (rounds done, default), step (the 0-based round) or any "
                   "column the runs share (clock/time for an asynchronous run)")
    p.add_argument("--output", "-o", default="curves.png", help="the PNG to write (default: curves.png)")
    p.add_argument("--label", action="append", default=None,
                   help="a legend label per run, in the order the runs are found, repeatable (default: the run directories' names)")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    """``lfed plot``: a mistake is one line, ``lfed plot: error: ...``, and exit status 2."""
    args = parser().parse_args(list(sys.argv[2:] if argv is None else argv))
    try:
        fig = plot_runs(args.runs, args.metric or ["test/acc"], x=args.x, output=args.output, labels=args.label)
    except PlotError as err:
        print(f"lfed plot: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    for metric, labels in fig.lfed_missing.items():
        print(f"lfed plot: {metric}: not in {', '.join(labels)} (left out of that panel)", file=sys.stderr, flush=True)
    runs = len({lab for labs in fig.lfed_series.values() for lab in labs})
    print(f"lfed plot: wrote {args.output} ({', '.join(fig.lfed_series)} of {runs} run{'s' if runs != 1 else ''})", flush=True)
