"""The papers' experiments under a fair protocol: a grid per method, chosen on validation, seeds.

A study is one YAML file of ``configs/paper/grids/``: a base config, overrides, the rounds, the
seeds, and for each method its config and its grid (``model.training.client_lr`` for most; FedAdam's server
learning rate at the client learning rate another method chose). For every method the script

1. runs every grid point with the first seed and picks the point with the best
   ``final/val_acc_last10pct``: the mean accuracy over the last 10% of rounds on the server's
   validation split (``data.validation_fraction``), which no client trains on, never the test set;
2. runs the chosen point with every other seed;
3. reports the test accuracy over the last 10% of rounds, mean ± standard deviation over seeds,
   whether the run had settled (the last-10% mean within 1 point of the mean of the 10% of rounds
   before it, on every seed), a flag when the choice lies on the edge of the grid, the per-seed
   (paired) difference against the study's reference method, and the diagnostics the issue asks
   for (``round/amplification``, attention logit spread, ``max η λ U``, both BMTAs); with the study
   key ``targets`` also, per target test accuracy, the rounds and cumulative client uploads at the
   first evaluation that reached it (AdaFL's "rounds (uploads) to reach X%", :func:`first_reach`),
   mean ± standard deviation over the seeds that reached it;
4. with the study key ``longer: N``, runs every chosen point again for N rounds on every seed and
   reports the same three figures for those runs (accuracy, settled, paired): whether the comparison
   holds once the runs have settled, without re-running the grid;

With the study key ``metric: personal`` (personalized FL, SPEC §11) the figures are the per-client ones of
lfed's personalized evaluation instead (:func:`per_client_key`, :func:`personal_val_score`,
:func:`personal_figure`): the grid point is chosen on the last-10% mean of ``personal_val/acc_mean`` (each
client's personalized model on the client's own validation split, ``data.client_validation_fraction``; the
global model's ``global_val/acc_mean`` for a method without a personalized model, FedAvg), and the reported
figure, the settled check, the paired differences and the plot are the last-10% mean of ``personal/acc_mean``
(each client's personalized model on its own held-out test split, ``data.holdout_fraction``; fallback
``global/acc_mean``), with the worst-10% and the global model's figures beside it.

and writes its section of RESULTS.md (between ``<!-- protocol:NAME -->`` markers) and a plot of
mean ± band over seeds. Runs go through lfed's own CLI parser (``paper_results.Runner``) and are
cached per argument list in ``benchmarks/results/protocol/run_cache.jsonl`` (one line a run): a rerun reuses them, unless a config file
or a file it names (a base checkpoint) has changed since (``paper_results.inputs_fingerprint``): that run trains again.

Usage (from the repository root)::

    python benchmarks/studies/paper_protocol.py configs/paper/grids/igfl_device_rho1.yaml
    python benchmarks/studies/paper_protocol.py configs/paper/grids/igfl_device_rho1.yaml --quick   # smoke test

``--lock FILE`` takes an exclusive ``flock`` on FILE around each run (to share a small machine with
other CPU-heavy jobs one at a time). Not part of the test suite.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import math
import os
import re
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # studies/, the harness

import harness  # noqa: E402
import yaml  # noqa: E402
from paper_results import REPO, Run, Runner, git_head  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "protocol"
RESULTS = REPO / "RESULTS.md"
SETTLED_POINTS = 1.0  # the last-10% mean may move by at most this (accuracy points) over the window before it


# --------------------------------------------------------------------------- the study file
@dataclass
class Method:
    name: str
    config: Path
    grid: dict[str, list]
    fixed_from: dict[str, str]  # parameter -> method whose chosen value it takes
    overrides: list[str]


@dataclass
class Study:
    name: str
    title: str
    description: str
    base: list[Path]
    overrides: list[str]
    rounds: int
    evaluate_every: int
    seeds: list[int]
    reference: str
    methods: list[Method]
    paper: dict[str, float]
    paper_label: str
    runs_from: str  # the study whose cached runs this one shares (runs with the same arguments)
    targets: list[float] = field(default_factory=list)  # test accuracies to report rounds/uploads to reach
    longer: int | None = None  # rounds of a second, longer run of every chosen point on every seed (None: none)
    metric: str = "global"  # "global": the server's validation / test split; "personal": per-client (SPEC §11)


METRICS = ("global", "personal")


def _need(d: dict, key: str, where: str):
    if key not in d:
        raise ValueError(f"{where}: missing '{key}'")
    return d[key]


def config_value(configs: list[Path], overrides: list[str], key: str):
    """The value of the dotted ``key`` (``data.client_validation_fraction``) that the config files and then the
    ``--key=value`` overrides give it, last one wins (None: none sets it). Read as YAML, as LightningCLI does."""
    value = None
    for config in configs:
        node = yaml.safe_load(config.read_text()) or {}
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            value = node
    for arg in overrides:
        if arg.startswith(f"--{key}="):
            value = yaml.safe_load(arg.split("=", 1)[1])
    return value


def load_study(path: Path) -> Study:
    """Read and check a study file (every error names the file and the key)."""
    raw = yaml.safe_load(path.read_text())
    where = str(path)
    methods = []
    for name, m in _need(raw, "methods", where).items():
        grid = m.get("grid", {})
        if not grid or any(not isinstance(v, list) or not v for v in grid.values()):
            raise ValueError(f"{where}: methods.{name}.grid must map parameters to non-empty lists")
        config = REPO / _need(m, "config", f"{where}: methods.{name}")
        if not config.is_file():
            raise ValueError(f"{where}: methods.{name}.config: no file {config}")
        methods.append(Method(name, config, grid, dict(m.get("fixed_from", {})), list(m.get("overrides", []))))
    names = [m.name for m in methods]
    for m in methods:
        for param, other in m.fixed_from.items():
            if other not in names[: names.index(m.name)]:
                raise ValueError(f"{where}: methods.{m.name}.fixed_from.{param}: '{other}' must be a method listed before it")
    seeds = [int(s) for s in _need(raw, "seeds", where)]
    if len(seeds) < 1:
        raise ValueError(f"{where}: seeds: give at least one")
    targets = raw.get("targets") or []
    if not isinstance(targets, list) or any(isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1
                                            for t in targets):
        raise ValueError(f"{where}: targets: a list of test accuracies in (0, 1] (fractions, e.g. [0.9, 0.95]), got {targets!r}")
    longer = raw.get("longer")
    rounds = int(_need(raw, "rounds", where))
    if longer is not None and (isinstance(longer, bool) or not isinstance(longer, int) or longer <= rounds):
        raise ValueError(f"{where}: longer: the rounds of the longer runs, an integer above rounds ({rounds}), got {longer!r}")
    reference = raw.get("reference", names[0])
    if reference not in names:
        raise ValueError(f"{where}: reference: '{reference}' is not one of the methods {names}")
    metric = raw.get("metric", "global")
    if metric not in METRICS:
        raise ValueError(f"{where}: metric: {metric!r} is not one of {METRICS} (global: the server's validation and test "
                         "splits; personal: each client's own validation and held-out splits)")
    if metric == "personal" and targets:
        raise ValueError(f"{where}: targets: rounds to reach a test accuracy are read off the global test accuracy; "
                         "not with metric: personal")
    if metric == "personal":  # selection needs each client's own validation split: refuse before any run trains
        base = [REPO / b for b in _need(raw, "base", where)]
        for m in methods:
            key = "data.client_validation_fraction"
            values = m.grid.get(key) or [config_value([*base, m.config], [*raw.get("overrides", []), *m.overrides], key)]
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in values):
                raise ValueError(f"{where}: methods.{m.name}: metric: personal chooses on each client's own validation "
                                 f"split; set {key} > 0 (got {values[0]!r}) in the base, the method's config or the "
                                 "overrides")
    return Study(
        name=path.stem, title=_need(raw, "title", where), description=raw.get("description", "").strip(),
        base=[REPO / b for b in _need(raw, "base", where)], overrides=list(raw.get("overrides", [])),
        rounds=rounds, evaluate_every=int(raw.get("evaluate_every", 5)), seeds=seeds,
        reference=reference, methods=methods, paper=dict(raw.get("paper", {}) or {}), paper_label=raw.get("paper_label", ""),
        runs_from=str(raw.get("runs_from", path.stem)), targets=sorted(float(t) for t in targets),
        longer=longer, metric=metric,
    )


# --------------------------------------------------------------------------- running
@contextlib.contextmanager
def cpu_lock(path: str | None):
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def window_mean(history: list[dict], key: str, lo: float, hi: float, last: int) -> float | None:
    """Mean of ``key`` over evaluations with round in ``(lo * last, hi * last]``."""
    vals = [h[key] for h in history if h.get(key) is not None and lo * last < h["round"] <= hi * last]
    return sum(vals) / len(vals) if vals else None


def first_reach(history: list[dict], target: float) -> tuple[int, int] | None:
    """``(round, uploads)`` of the first evaluation whose test accuracy ``acc`` is ``>= target``.

    AdaFL's (seed 003) "rounds (uploads) to reach X%": ``round`` is the number of completed rounds
    at that evaluation and ``uploads`` the cumulative client uploads ``Σ_t K_t`` up to it (the
    history of :class:`paper_results.Recorder`). ``None`` if no evaluation reached ``target``. The
    evaluation grid makes the round exact only to a multiple of the evaluation interval.
    """
    from lfed.evaluation.communication import rounds_to_reach  # checks rounds increase and uploads never decrease

    return rounds_to_reach([(h["round"], h["uploads"], h["acc"]) for h in history], target)


def reach_cell(runs: list[Run], target: float) -> str:
    """A table cell: rounds / uploads to ``target``, mean ± std over the runs that reached it."""
    hits = [first_reach(run.history, target) for run in runs]  # a run that diverged later still reached it
    reached = [h for h in hits if h is not None]
    if not reached:
        return "not reached"
    (rm, rs), (um, us) = mean_std([float(r) for r, _ in reached]), mean_std([float(u) for _, u in reached])
    cell = f"{rm:.0f} ± {rs:.0f} / {um:.0f} ± {us:.0f}"
    return cell if len(reached) == len(runs) else f"{cell} ({len(reached)}/{len(runs)} reached)"


def settling(run: Run, key: str = "acc") -> float | None:
    """How much the last-10% mean of ``key`` (the test accuracy) moved against the 10% of rounds before it (points)."""
    if not run.history:
        return None
    last = run.history[-1]["round"]
    a, b = window_mean(run.history, key, 0.9, 1.0, last), window_mean(run.history, key, 0.8, 0.9, last)
    return None if a is None or b is None else 100 * abs(a - b)


# --------------------------------------------------------------------------- metric: personal (SPEC §11)
def per_client_key(history: list[dict], split: str = "test", stat: str = "acc_mean") -> str:
    """The history key of a personalized run's figure: ``personal{_val}/<stat>`` when the run logged it (a method
    with a personalized model), else the global model's ``global{_val}/<stat>`` (FedAvg: its personalized model is
    the global model). ``split``: ``"test"`` (each client's held-out split) or ``"val"`` (each client's validation
    split, ``data.client_validation_fraction``). Neither in the history: a ValueError naming both keys."""
    suffix = {"test": "", "val": "_val"}[split]
    own, glob = f"personal{suffix}/{stat}", f"global{suffix}/{stat}"
    for key in (own, glob):
        if any(h.get(key) is not None for h in history):
            return key
    hint = (" (the study must set data.client_validation_fraction > 0: each client's own validation split)" if split == "val"
            else " (the study must set data.holdout_fraction > 0: each client's own test split)")
    raise ValueError(f"metric personal: the run's evaluations have neither '{own}' nor '{glob}'{hint}")


def last10_of(history: list[dict], key: str) -> float | None:
    """Mean of ``key`` over the evaluations in the last 10% of the run's rounds (None: no evaluation there)."""
    return window_mean(history, key, 0.9, 1.0, history[-1]["round"]) if history else None


def personal_val_score(run: Run) -> float:
    """The selection score of ``metric: personal``: the last-10% mean of ``personal_val/acc_mean`` (fallback
    ``global_val/acc_mean``, :func:`per_client_key`); -inf for a run that diverged; a ValueError when the run has
    neither key (the study forgot ``data.client_validation_fraction``)."""
    if "diverged_at_round" in run.extra:
        return -math.inf
    v = last10_of(run.history, per_client_key(run.history, "val"))
    return -math.inf if v is None or not math.isfinite(v) else float(v)


def personal_figure(run: Run, stat: str = "acc_mean", own: bool = True) -> float:
    """The reported figure of ``metric: personal``: the last-10% mean of ``personal/<stat>`` (``own``; fallback
    ``global/<stat>``) or of the global model's ``global/<stat>`` (not ``own``); NaN for a run that diverged or
    with no evaluation in the window. A missing key is a ValueError (:func:`per_client_key`)."""
    if "diverged_at_round" in run.extra:
        return math.nan
    key = per_client_key(run.history, "test", stat) if own else f"global/{stat}"
    if not own and not any(h.get(key) is not None for h in run.history):
        raise ValueError(f"metric personal: the run's evaluations have no '{key}'")
    v = last10_of(run.history, key)
    return math.nan if v is None else float(v)


def has_per_client(runs: list[Run], key: str) -> bool:
    return any(h.get(key) is not None for run in runs for h in run.history)


def personal_settling(run: Run) -> float | None:
    """:func:`settling` of the personalized figure (``personal/acc_mean``, fallback ``global/acc_mean``)."""
    if not run.history or "diverged_at_round" in run.extra:
        return None
    return settling(run, per_client_key(run.history, "test"))


def per_client_last10(run: Run) -> dict[str, float | None]:
    """The last-10% mean of every per-client metric the run logged (``personal/``, ``global/``, ``*_val/`` keys)."""
    keys = sorted({k for h in run.history for k in h if k.startswith(("personal/", "global/", "personal_val/", "global_val/"))})
    return {k: last10_of(run.history, k) for k in keys}


def val_score(run: Run) -> float:
    v = run.summary.get("final/val_acc_last10pct")
    if v is None or "diverged_at_round" in run.extra or not math.isfinite(v):
        return -math.inf
    return float(v)


def point_label(point: dict) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v:g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}" for k, v in point.items())


def run_study(study: Study, runner: Runner, lock: str | None, quick: bool, log, together: bool = False) -> dict:
    """Run ``study``'s protocol (module docstring); with ``together``, the runs that can start at once train as
    one group (``lfed grid``'s engine, :meth:`paper_results.Runner.train_together`): every method's first-seed
    grid (those without ``fixed_from``) at once, then each ``fixed_from`` grid, then every chosen point's
    other seeds at once. The results are the same runs' results up to float32 round-off."""
    rounds = 6 if quick else study.rounds
    longer = None if study.longer is None else (12 if quick else study.longer)
    every = 2 if quick else study.evaluate_every
    seeds = study.seeds[:2] if quick else study.seeds
    chosen: dict[str, dict] = {}
    out: dict[str, dict] = {}
    score = personal_val_score if study.metric == "personal" else val_score

    def job(method: Method, point: dict, seed: int, n: int = rounds) -> tuple[str, list[Path], list[str]]:
        args = [*study.overrides, *method.overrides, f"--trainer.max_steps={n}", f"--trainer.val_check_interval={every}",
                f"--seed_everything={seed}", f"--model.seed={seed}", f"--data.seed={seed}",
                *(f"--{k}={v}" for k, v in point.items())]
        name = f"{study.runs_from}/{method.name}/{point_label(point)}/seed{seed}" + ("" if n == rounds else f"/{n}rounds")
        return name, [*study.base, method.config], args

    def one(method: Method, point: dict, seed: int, n: int = rounds) -> Run:
        name, configs, args = job(method, point, seed, n)
        with cpu_lock(None if runner.is_cached(name, configs, args) else lock):  # a cached run trains nothing
            return runner.run(name, configs, args)

    def train_together(jobs: list) -> None:
        if together and any(not runner.is_cached(*j) for j in jobs):
            with cpu_lock(lock):
                runner.train_together(jobs)

    def grid_of(method: Method) -> list[dict]:
        fixed = {param: chosen[other][param] for param, other in method.fixed_from.items()}
        keys = list(method.grid)
        return [dict(fixed, **dict(zip(keys, values))) for values in itertools.product(*(method.grid[k] for k in keys))]

    train_together([job(m, point, seeds[0]) for m in study.methods if not m.fixed_from for point in grid_of(m)])
    selections = {}
    for method in study.methods:
        grid = grid_of(method)
        log(f"{study.name}: {method.name}, {len(grid)} grid points on seed {seeds[0]}, then {len(seeds) - 1} more seeds")
        train_together([job(method, point, seeds[0]) for point in grid])  # a fixed_from grid (the others are cached)
        selection = [(point, one(method, point, seeds[0])) for point in grid]
        best_point, best_run = max(selection, key=lambda pr: score(pr[1]))
        chosen[method.name] = best_point
        selections[method.name] = selection, best_point, best_run
    train_together([job(m, chosen[m.name], s) for m in study.methods for s in seeds[1:]])
    if longer:  # the chosen points again, longer, on every seed: has the comparison settled?
        train_together([job(m, chosen[m.name], s, longer) for m in study.methods for s in seeds])
    for method in study.methods:
        selection, best_point, best_run = selections[method.name]
        keys = list(method.grid)
        runs = [best_run] + [one(method, best_point, s) for s in seeds[1:]]
        edge = {k: best_point[k] in (method.grid[k][0], method.grid[k][-1]) and len(method.grid[k]) > 1 for k in keys}
        out[method.name] = {"grid": [(p, score(r), r) for p, r in selection], "point": best_point, "runs": runs,
                            "edge": [k for k, e in edge.items() if e], "keys": keys,
                            "longer": [one(method, best_point, s, longer) for s in seeds] if longer else []}
    return out


# --------------------------------------------------------------------------- reporting
def mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt_pm(m: float, s: float, scale: float = 100.0, digits: int = 2) -> str:
    return "–" if not math.isfinite(m) else f"{scale * m:.{digits}f} ± {scale * s:.{digits}f}"


def last10(run: Run) -> float:
    return math.nan if "diverged_at_round" in run.extra else run.last10


def plot(study: Study, res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def key(run: Run) -> str:  # the curve: the test accuracy, or the personalized figure (metric: personal)
        return per_client_key(run.history, "test") if study.metric == "personal" and run.history else "acc"

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, r in res.items():
        curves = [{h["round"]: h[key(run)] for h in run.history if h.get(key(run)) is not None}
                  for run in (r.get("longer") or r["runs"])]
        common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if not common:
            continue
        mean = [statistics.fmean(c[x] for c in curves) for x in common]
        std = [statistics.stdev([c[x] for c in curves]) if len(curves) > 1 else 0.0 for x in common]
        line, = ax.plot(common, [100 * m for m in mean], label=f"{name} ({point_label(r['point'])})", lw=1.2)
        ax.fill_between(common, [100 * (m - s) for m, s in zip(mean, std)], [100 * (m + s) for m, s in zip(mean, std)],
                        color=line.get_color(), alpha=0.18, lw=0)
    for t in study.targets:  # the accuracies whose rounds / uploads to reach the table reports
        ax.axhline(100 * t, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("round")
    ax.set_ylabel("personalized accuracy (%), mean over clients,\nmean ± std over seeds" if study.metric == "personal"
                  else "test accuracy (%), mean ± std over seeds")
    ax.set_title("\n".join(textwrap.wrap(study.title, 100)), fontsize=9)  # long titles wrap, not clip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    lo = min((100 * h[key(run)] for r in res.values() for run in (r.get("longer") or r["runs"]) for h in run.history
              if h["round"] >= 0.2 * study.rounds and h.get(key(run)) is not None), default=0)
    ax.set_ylim(max(0, lo - 5), None)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def diagnostics(runs: list[Run]) -> str:
    parts = []
    for key, label in (("round/amplification_last10pct", "amplification"), ("attention/logit_spread_mean", "logit spread"),
                       ("attention/mean_sq_norm_mean", "‖Δ‖²"), ("efl/max_lr_lambda_u_max", "max ηλU")):
        vals = [r.extra[key] for r in runs if key in r.extra]
        if vals:
            parts.append(f"{label} {statistics.fmean(vals):.3g}")
    ws = [r.extra["attention_weight_sum_mean"] for r in runs if "attention_weight_sum_mean" in r.extra]
    if ws and abs(statistics.fmean(ws) - 1) > 1e-6:
        parts.append(f"attention weight sum {statistics.fmean(ws):.2f}")
    for key, label in (("final/bmta_global", "BMTA global"), ("final/bmta_local", "BMTA local")):
        vals = [r.summary[key] for r in runs if key in r.summary]
        if vals:
            m, s = mean_std(vals)
            parts.append(f"{label} {fmt_pm(m, s, digits=1)}")
    return "; ".join(parts) or "–"


def together_note(res: dict) -> str:
    """How many of the runs were trained in groups (``--together``), for the section's cost sentence."""
    runs = [x for r in res.values() for x in [*(g[2] for g in r["grid"]), *r["runs"][1:], *r.get("longer", [])]]
    grouped = [x for x in runs if x.extra.get("group_size", 1) > 1]
    if not grouped:
        return ""
    return (f"; {len(grouped)} of the {len(runs)} runs trained together in groups of up to "
            f"{max(x.extra['group_size'] for x in grouped)} (lfed.lightning.group, --together): a grouped run's seconds are its "
            "group's divided by its size")


def outcome(runs: list[Run], ref: list[Run] | None, figure=last10, settle=settling) -> tuple[str, str, str]:
    """Three table cells for ``runs`` (one per seed): test last-10% mean ± std, settled (the largest move over
    seeds), and the paired per-seed difference against ``ref`` (the reference method's runs; None for itself).
    ``figure`` / ``settle``: the run's figure and its settling (metric personal: :func:`personal_figure`,
    :func:`personal_settling`)."""
    m, s = mean_std([figure(x) for x in runs])
    moves = [settle(x) for x in runs]
    moved = max((x for x in moves if x is not None), default=math.nan)
    settled = "–" if not math.isfinite(moved) else ("yes" if moved <= SETTLED_POINTS else "**no**") + f" ({moved:.1f})"
    paired = "–"
    if ref is not None:
        diffs = [100 * (figure(a) - figure(b)) for a, b in zip(runs, ref)]
        dm, ds = mean_std(diffs)
        wins = sum(d > 0 for d in diffs if math.isfinite(d))
        paired = "–" if not math.isfinite(dm) else f"{dm:+.2f} ± {ds:.2f} ({wins}/{len(diffs)} seeds better)"
    return fmt_pm(m, s), settled, paired


def personal_cells(runs: list[Run]) -> dict[str, str]:
    """The table cells of ``metric: personal`` for one method's runs (one per seed), mean ± std over seeds of
    the last-10% means: personalized accuracy mean and worst 10% (the global model's for a method without a
    personalized model), the global model's, and (token data) the perplexities."""
    def cell(stat: str, own: bool, scale: float = 100.0) -> str:
        prefix = "personal" if own else "global"
        if not has_per_client(runs, f"{prefix}/{stat}") and not (own and has_per_client(runs, f"global/{stat}")):
            return "–"
        return fmt_pm(*mean_std([personal_figure(x, stat, own) for x in runs]), scale=scale)

    cells = {"acc": cell("acc_mean", True), "worst": cell("acc_worst10pct", True),
             "global": cell("acc_mean", False), "global_worst": cell("acc_worst10pct", False)}
    if has_per_client(runs, "global/perplexity_mean"):
        cells["ppl"] = cell("perplexity_mean", True, 1.0)
        cells["ppl_worst"] = cell("perplexity_worst10pct", True, 1.0)
        cells["global_ppl"] = f"{cell('perplexity_mean', False, 1.0)} / {cell('perplexity_worst10pct', False, 1.0)}"
    return cells


def personal_section(study: Study, res: dict, head: list[str], seeds: list[int], longer: int | None) -> list[str]:
    """The protocol text and table of ``metric: personal`` (after ``head``: the title, description, cost)."""
    L = list(head)
    L[-1] += (f" Personalized protocol (SPEC §11): every client holds out its own test split (data.holdout_fraction) "
              f"and, of the rest, its own validation split (data.client_validation_fraction); no client trains on either. "
              f"Each method's grid ran on seed {seeds[0]}; the point with the best last-10% mean over clients of each "
              f"client's personalized model's accuracy on the client's own *validation* split (personal_val/acc_mean; "
              f"the global model's, global_val/acc_mean, for a method without a personalized model) then ran on the "
              f"other seeds. Reported: over the evaluations in the last 10% of rounds, the mean over clients of each "
              f"client's personalized model's accuracy on the client's own held-out *test* split (personal/acc_mean), "
              f"the worst 10% (the mean of the worst ceil(0.1 n) of the n evaluated clients), and the same two of the "
              f"global model on the same splits; mean ± std over seeds. Settled = the personalized last-10% mean within "
              f"{SETTLED_POINTS:g} point of the 10% of rounds before it on every seed; paired = the per-seed difference "
              f"of the personalized mean against {study.reference}.")
    if longer:
        L[-1] += (f" Then every chosen point ran again for {longer} rounds on every seed (same grid choice); the "
                  f"last three columns and the plot are those longer runs.")
    cells = {name: personal_cells(r["runs"]) for name, r in res.items()}
    ppl = any("ppl" in c for c in cells.values())
    header = (f"| method | grid (validation last-10%, seed {seeds[0]}) | chosen | personalized acc (%) mean ± std "
              f"| personalized worst 10% (%) | global-model acc (%) | global-model worst 10% (%) | settled (max move, pts) "
              f"| vs {study.reference}, paired (personalized, pts) |")
    ncol = 9
    if ppl:
        header += " personalized perplexity | personalized perplexity worst 10% | global-model perplexity mean / worst 10% |"
        ncol += 3
    if study.paper:
        header += f" {study.paper_label or 'paper'} |"
        ncol += 1
    if longer:
        header += f" at {longer} rounds: personalized acc (%) | settled | vs {study.reference}, paired (pts) |"
        ncol += 3
    L += ["", header, "|" + "---|" * ncol]
    for name, r in res.items():
        grid, chosen = grid_cells(r)
        ref = None if name == study.reference else res[study.reference]["runs"]
        _, settled, paired = outcome(r["runs"], ref, personal_figure, personal_settling)
        c = cells[name]
        row = (f"| {name} | {grid} | {chosen} | {c['acc']} | {c['worst']} | {c['global']} | {c['global_worst']} "
               f"| {settled} | {paired} |")
        if ppl:
            row += f" {c.get('ppl', '–')} | {c.get('ppl_worst', '–')} | {c.get('global_ppl', '–')} |"
        if study.paper:
            row += f" {study.paper.get(name, '–')} |"
        if longer:
            ref = None if name == study.reference else res[study.reference]["longer"]
            row += " " + " | ".join(outcome(r["longer"], ref, personal_figure, personal_settling)) + " |"
        L.append(row)
    L += ["", f"![]({(OUT / study.name).relative_to(REPO)}.png)", ""]
    return L


def grid_cells(r: dict) -> tuple[str, str]:
    """A method's grid cell (each point's validation last-10%) and chosen cell (``(edge)`` on the grid's edge)."""
    grid = ", ".join(f"{point_label({k: v for k, v in p.items() if k in r['keys']})}: "
                     + ("div." if not math.isfinite(v) else f"{100 * v:.1f}") for p, v, _ in r["grid"])
    return re.sub(r"client_lr=", "", grid), point_label(r["point"]) + (" (edge)" if r["edge"] else "")


def section(study: Study, res: dict, cmd: str, seconds: float, load: tuple[float, float] | None, quick: bool) -> list[str]:
    """The study's RESULTS.md section; ``load`` (the 1-minute load at the start and end) is None when every run was
    read from the run cache (a load taken then says nothing of the runs')."""
    seeds = study.seeds[:2] if quick else study.seeds
    rounds = 6 if quick else study.rounds
    longer = None if study.longer is None else (12 if quick else study.longer)
    n_runs = sum(len(r["grid"]) + len(r["runs"]) - 1 + len(r.get("longer", [])) for r in res.values())
    L = [f"### {study.title}", "", study.description, "",
         f"Command: `{cmd}` (lfed {git_head()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). "
         f"{rounds} rounds, evaluated every {2 if quick else study.evaluate_every}; seeds {seeds}; {n_runs} runs, "
         f"{seconds / 60:.1f} CPU-minutes of training and evaluation on this 2-core machine ("
         + ("every run read from the run cache: the times are those of the runs that trained them"
            if load is None else f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end")
         + f"; runs took turns with other jobs through a lock{together_note(res)}). "]
    if study.metric == "personal":
        return personal_section(study, res, L, seeds, longer)
    L[-1] += (
         f"Each method's grid ran on seed {seeds[0]}; the point with the best last-10% *validation* accuracy "
         f"(a {study.overrides and 'server-held split of the training set' or 'split'}, no client trains on it) then ran on "
         f"the other seeds. Test accuracy = mean over the evaluations in the last 10% of rounds. "
         f"Settled = the last-10% mean within {SETTLED_POINTS:g} point of the 10% of rounds before it on every seed.")
    if longer:
        L[-1] += (f" Then every chosen point ran again for {longer} rounds on every seed (same grid choice, not re-chosen "
                  f"at {longer}), to see whether the comparison holds once more runs have settled; the plot shows "
                  f"these longer runs.")
    if study.targets:
        L[-1] += (" To X%: rounds / uploads = the completed rounds and the cumulative client uploads (Σ_t K_t) at the "
                  "first evaluation whose *test* accuracy was ≥ X%, counted on test accuracy as the paper does (the "
                  "choice of the grid point above is still made on validation), mean ± std over the seeds that reached "
                  "it (\"k/n reached\" when not all did); exact only to the evaluation interval.")
    reach_cols = [f"to {100 * t:g}%: rounds / uploads" for t in study.targets]
    L += ["", f"| method | grid (validation last-10%, seed {seeds[0]}) | chosen | test last-10% (%) mean ± std | settled (max move, pts) "
          f"| vs {study.reference}, paired (pts) | " + "".join(f"{c} | " for c in reach_cols)
          + f"diagnostics | {study.paper_label or 'paper'} |",
          "|---|---|---|---|---|---|" + "---|" * len(reach_cols) + "---|---|"]
    if longer:
        L[-2] += f" at {longer} rounds: test last-10% (%) mean ± std | settled | vs {study.reference}, paired (pts) |"
        L[-1] += "---|---|---|"
    for name, r in res.items():
        grid, chosen = grid_cells(r)
        ref = None if name == study.reference else res[study.reference]["runs"]
        reach = "".join(f"{reach_cell(r['runs'], t)} | " for t in study.targets)
        acc, settled, paired = outcome(r["runs"], ref)
        L.append(f"| {name} | {grid} | {chosen} | {acc} | {settled} | {paired} | {reach}{diagnostics(r['runs'])} "
                 f"| {study.paper.get(name, '–')} |")
        if longer:
            ref = None if name == study.reference else res[study.reference]["longer"]
            L[-1] += " " + " | ".join(outcome(r["longer"], ref)) + " |"
    L += ["", f"![]({(OUT / study.name).relative_to(REPO)}.png)", ""]
    return L


def write_section(study: Study, lines: list[str]) -> None:
    start, end = f"<!-- protocol:{study.name} -->", f"<!-- end protocol:{study.name} -->"
    block = "\n".join([start, *lines, end])
    text = RESULTS.read_text() if RESULTS.is_file() else "# Results\n"
    pattern = re.escape(start) + r".*?" + re.escape(end)
    if re.search(pattern, text, re.S):
        text = re.sub(pattern, lambda _: block, text, flags=re.S)
    else:
        anchor = "<!-- protocol sections -->"
        text = text.replace(anchor, anchor + "\n\n" + block) if anchor in text else text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)


def to_json(res: dict, targets: list[float] = (), metric: str = "global") -> dict:
    """The study's results; with ``metric: personal`` every run also keeps its per-client figures (``personal``:
    :func:`personal_val_score` / :func:`personal_figure`, and :func:`per_client_last10` of every key)."""
    def personal(x: Run) -> dict:
        if metric != "personal":
            return {}
        fig = {"val_last10": None if "diverged_at_round" in x.extra else personal_val_score(x),
               "test_last10": personal_figure(x), "settling": personal_settling(x),
               "key": per_client_key(x.history) if x.history else None, "last10": per_client_last10(x)}
        return {"personal": fig}

    return {name: {"point": r["point"], "edge": r["edge"], "grid_keys": r["keys"],
                   "grid": [{"point": p, "val_last10": v if math.isfinite(v) else None, "test_last10": last10(x), **personal(x)}
                            for p, v, x in r["grid"]],
                   "seeds": [{"args": x.args, "test_last10": last10(x), "val_last10": x.summary.get("final/val_acc_last10pct"),
                              "seconds": x.seconds, "settling": settling(x), "extra": x.extra, "summary": x.summary,
                              "reach": {f"{t:g}": first_reach(x.history, t) for t in targets}, **personal(x)} for x in r["runs"]],
                   "longer": [{"args": x.args, "test_last10": last10(x), "seconds": x.seconds, "settling": settling(x),
                               "extra": x.extra, "summary": x.summary, **personal(x)} for x in r.get("longer", [])]}
            for name, r in res.items()}


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, quick_help="6 rounds, 2 seeds: a smoke test (not written to RESULTS.md)")
    p.add_argument("study", type=Path, nargs="+", help="study files (configs/paper/grids/*.yaml)")
    p.add_argument("--data-dir", default=os.environ.get("LFED_DATA_DIR"), help="dataset folder (default $LFED_DATA_DIR)")
    p.add_argument("--fresh", action="store_true", help="ignore cached runs")
    p.add_argument("--lock", default=None, help="flock this file around each run (share the CPU one job at a time)")
    p.add_argument("--together", action="store_true",
                   help="train the runs that can start at once as one group (lfed grid's engine; same results up to "
                        "float32 round-off, faster on small models)")
    p.add_argument("--methods", default=None,
                   help="comma-separated subset of each study's methods to run and report (the reference always runs)")
    args = p.parse_args(argv)
    if args.data_dir is None:
        p.error("--data-dir: give the dataset folder (or set LFED_DATA_DIR)")
    import tempfile

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} load {harness.loadavg():.2f}] {msg}", flush=True)

    studies = [load_study(s) for s in args.study]  # every file checked before any run
    if args.methods:
        wanted = {m.strip() for m in args.methods.split(",") if m.strip()}
        for study in studies:
            names = {m.name for m in study.methods}
            unknown = wanted - names
            if len(studies) == 1 and unknown:
                p.error(f"--methods: {sorted(unknown)} not in {study.name}'s methods {sorted(names)}")
            keep = wanted | {study.reference} | {o for m in study.methods if m.name in wanted for o in m.fixed_from.values()}
            study.methods = [m for m in study.methods if m.name in keep]
    for study in studies:
        started, load0 = harness.clock(), harness.loadavg()
        with tempfile.TemporaryDirectory() as work:
            cache = None if args.quick else OUT / "run_cache"
            runner = Runner(Path(args.data_dir), Path(work), log, cache=cache, fresh=args.fresh)
            res = run_study(study, runner, args.lock, args.quick, log, together=args.together)
        seconds = sum(x.seconds for r in res.values() for x in [*(g[2] for g in r["grid"]), *r["runs"][1:], *r.get("longer", [])])
        path = REPO / "configs" / "paper" / "grids" / f"{study.name}.yaml"
        cmd = f"python benchmarks/studies/paper_protocol.py {path.relative_to(REPO)}" + (" --together" if args.together else "")
        lines = section(study, res, cmd, seconds, (load0, harness.loadavg()) if runner.trained else None, args.quick)
        print("\n".join(lines))
        if args.quick:
            continue
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{study.name}.json").write_text(json.dumps(to_json(res, study.targets, study.metric), indent=1, default=str))
        plot(study, res, OUT / f"{study.name}.png")
        write_section(study, lines)
        log(f"{study.name}: written to RESULTS.md ({(harness.clock() - started) / 60:.1f} min wall)")


if __name__ == "__main__":
    main()
