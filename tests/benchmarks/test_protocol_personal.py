"""benchmarks/studies/paper_protocol.py with ``metric: personal`` (SPEC §11): the choice on each client's own validation
split, the reported per-client figures, the fallback to the global model's for FedAvg, the missing-key error,
on hand-made run histories; and the Recorder's per-client keys (old cached runs without them still load)."""

import dataclasses
import json
import math
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "studies"))
import paper_protocol as pp  # noqa: E402
import paper_results  # noqa: E402
from paper_results import Run  # noqa: E402


def history(rows: dict[str, list[float]], every: int = 10) -> list[dict]:
    """Evaluations every ``every`` rounds; ``rows`` maps a key to its value at each evaluation."""
    n = len(next(iter(rows.values())))
    return [{"round": every * (i + 1), "acc": 0.5, "val_acc": None, "client_acc": None, "uploads": 10 * every * (i + 1),
             **{k: v[i] for k, v in rows.items()}} for i in range(n)]


def personal_run(test: list[float], val: list[float], worst: float = 0.3, glob: float = 0.6, **extra) -> Run:
    """A personalized run of 10 evaluations every 10 rounds (the last-10% window is the last evaluation)."""
    n = len(test)
    rows = {"personal/acc_mean": test, "personal_val/acc_mean": val, "personal/acc_worst10pct": [worst] * n,
            "global/acc_mean": [glob] * n, "global/acc_worst10pct": [glob / 2] * n,
            "global_val/acc_mean": [glob] * n}
    return Run("p", history(rows), {}, 1.0, [], None, dict(extra))


def global_run(test: list[float], val: list[float]) -> Run:
    """FedAvg: no personalized model, only global/* and global_val/*."""
    rows = {"global/acc_mean": test, "global_val/acc_mean": val, "global/acc_worst10pct": [t - 0.2 for t in test],
            "global_val/acc_worst10pct": [v - 0.2 for v in val]}
    return Run("g", history(rows), {}, 1.0, [], None, {})


def test_selection_is_the_last_10pct_of_the_personal_validation_mean():
    run = personal_run(test=[0.1] * 8 + [0.5, 0.9], val=[0.2] * 8 + [0.4, 0.8])  # rounds 10..100: window (90, 100]
    assert pp.personal_val_score(run) == pytest.approx(0.8)
    assert pp.personal_figure(run) == pytest.approx(0.9)  # the reported figure reads the test split, not validation
    assert pp.personal_figure(run, "acc_worst10pct") == pytest.approx(0.3)
    assert pp.personal_figure(run, own=False) == pytest.approx(0.6)  # the global model on the same splits
    assert pp.personal_figure(run, "acc_worst10pct", own=False) == pytest.approx(0.3)
    # with evaluations every 5 of 100 rounds the window holds rounds 95 and 100
    two = Run("two", history({"personal/acc_mean": [0.0] * 18 + [0.6, 0.8], "personal_val/acc_mean": [0.0] * 18 + [0.2, 0.4]},
                             every=5), {}, 1.0, [])
    assert pp.personal_val_score(two) == pytest.approx(0.3) and pp.personal_figure(two) == pytest.approx(0.7)


def test_a_method_without_a_personalized_model_falls_back_to_the_global_model_s_figures():
    run = global_run(test=[0.3] * 9 + [0.7], val=[0.2] * 9 + [0.65])
    assert pp.per_client_key(run.history, "val") == "global_val/acc_mean"
    assert pp.per_client_key(run.history, "test") == "global/acc_mean"
    assert pp.per_client_key(run.history, "test", "acc_worst10pct") == "global/acc_worst10pct"
    assert pp.personal_val_score(run) == pytest.approx(0.65)
    assert pp.personal_figure(run) == pytest.approx(0.7) == pp.personal_figure(run, own=False)
    assert pp.personal_figure(run, "acc_worst10pct") == pytest.approx(0.5)
    # a personalized run prefers its own model's keys
    assert pp.per_client_key(personal_run([0.5] * 10, [0.5] * 10).history, "val") == "personal_val/acc_mean"


def test_a_missing_key_is_an_error_naming_it():
    no_val = Run("x", history({"personal/acc_mean": [0.5] * 10, "global/acc_mean": [0.5] * 10}), {}, 1.0, [])
    with pytest.raises(ValueError, match=r"'personal_val/acc_mean' nor 'global_val/acc_mean'.*client_validation_fraction"):
        pp.personal_val_score(no_val)
    old = Run("old", history({"acc": [0.5] * 10}), {"final/val_acc_last10pct": 0.5}, 1.0, [])  # recorded before the keys
    with pytest.raises(ValueError, match=r"'personal/acc_mean' nor 'global/acc_mean'.*holdout_fraction"):
        pp.personal_figure(old)
    with pytest.raises(ValueError, match="'global/acc_worst10pct'"):
        pp.personal_figure(Run("y", history({"personal/acc_worst10pct": [0.1] * 10}), {}, 1.0, []), "acc_worst10pct", own=False)


def test_a_diverged_run_is_never_chosen_and_reports_nan():
    bad = personal_run([0.9] * 3, [0.9] * 3, diverged_at_round=31)
    assert pp.personal_val_score(bad) == -math.inf
    assert math.isnan(pp.personal_figure(bad)) and pp.personal_settling(bad) is None
    empty = Run("e", [], {}, 1.0, [], None, {"diverged_at_round": 2})  # diverged before any evaluation: no key error
    assert pp.personal_val_score(empty) == -math.inf and math.isnan(pp.personal_figure(empty))


def test_settling_and_paired_differences_use_the_personalized_figure():
    a = personal_run(test=[0.5] * 8 + [0.80, 0.82], val=[0.5] * 10)  # moved 2 points over (80, 90] -> (90, 100]
    b = personal_run(test=[0.5] * 8 + [0.79, 0.795], val=[0.5] * 10)
    assert pp.personal_settling(a) == pytest.approx(2.0) and pp.personal_settling(b) == pytest.approx(0.5)
    ref = [global_run([0.7] * 10, [0.7] * 10), global_run([0.8] * 10, [0.8] * 10)]
    acc, settled, paired = pp.outcome([a, b], ref, pp.personal_figure, pp.personal_settling)
    assert acc == "80.75 ± 1.77" and settled == "**no** (2.0)"
    assert paired == "+5.75 ± 8.84 (1/2 seeds better)"  # (0.82 - 0.70, 0.795 - 0.80) = (+12, -0.5) points
    last = pp.per_client_last10(a)
    assert last["personal/acc_mean"] == pytest.approx(0.82) and last["global_val/acc_mean"] == pytest.approx(0.6)


def study(tmp_path, extra: str = "metric: personal\n", cvf: str = "0.1"):
    path = tmp_path / "s.yaml"
    path.write_text("title: t\nbase: [configs/paper/personal/mnist_pathological.yaml]\nrounds: 100\nseeds: [0, 1]\n"
                    f"overrides: [--data.client_validation_fraction={cvf}]\nreference: FedAvg\n" + extra
                    + "methods:\n  FedAvg: {config: configs/paper/personal/alg_fedavg.yaml, grid: {model.training.client_lr: [0.1, 0.3]}}\n"
                    "  Ditto: {config: configs/paper/personal/alg_ditto.yaml, grid: {model.training.client_lr: [0.1, 0.3]}}\n")
    return path


def test_the_study_key_metric(tmp_path):
    assert pp.load_study(study(tmp_path, "")).metric == "global"  # the default: the existing studies are unchanged
    assert pp.load_study(study(tmp_path)).metric == "personal"
    with pytest.raises(ValueError, match="metric: 'local' is not one of"):
        pp.load_study(study(tmp_path, "metric: local\n"))
    with pytest.raises(ValueError, match=r"methods\.FedAvg: .*data\.client_validation_fraction > 0 \(got 0\)"):
        pp.load_study(study(tmp_path, cvf="0"))  # refused before any run trains
    with pytest.raises(ValueError, match="targets"):
        pp.load_study(study(tmp_path, "metric: personal\ntargets: [0.9]\n"))


def test_the_personal_section_and_json(tmp_path, monkeypatch):
    s = pp.load_study(study(tmp_path))
    point = {"model.training.client_lr": 0.1}

    def result(runs, val):
        return {"grid": [(point, val, runs[0]), ({"model.training.client_lr": 0.3}, -math.inf, runs[0])], "point": point,
                "runs": runs, "edge": ["model.training.client_lr"], "keys": ["model.training.client_lr"]}

    res = {"FedAvg": result([global_run([0.7] * 10, [0.7] * 10), global_run([0.8] * 10, [0.8] * 10)], 0.7),
           "Ditto": result([personal_run([0.9] * 10, [0.85] * 10), personal_run([0.92] * 10, [0.85] * 10)], 0.85)}
    monkeypatch.setattr(pp, "git_head", lambda: "abc")
    lines = pp.section(s, res, "cmd", 60.0, (0.0, 0.0), quick=False)
    text = "\n".join(lines)
    assert "load average 0.0 at the start, 0.0 at the end" in text
    cached = "\n".join(pp.section(s, res, "cmd", 60.0, None, quick=False))  # every run read from the cache
    assert "load average" not in cached and "every run read from the run cache" in cached
    header = next(line for line in lines if line.startswith("| method"))
    assert ("| personalized acc (%) mean ± std | personalized worst 10% (%) | global-model acc (%) "
            "| global-model worst 10% (%) | settled (max move, pts) | vs FedAvg, paired (personalized, pts) |") in header
    assert "perplexity" not in header  # only with token data
    rows = [line for line in lines if line.startswith(("| FedAvg |", "| Ditto |"))]
    sep = lines[lines.index(header) + 1]
    assert all(x.count("|") == header.count("|") for x in [sep, *rows])
    fedavg, ditto = rows
    assert "| 0.1: 70.0, 0.3: div. |" in fedavg and "| 75.00 ± 7.07 | 55.00 ± 7.07 | 75.00 ± 7.07 | 55.00 ± 7.07 |" in fedavg
    assert "| 91.00 ± 1.41 | 30.00 ± 0.00 | 60.00 ± 0.00 | 30.00 ± 0.00 |" in ditto
    assert "+16.00 ± 5.66 (2/2 seeds better)" in ditto  # (90 - 70, 92 - 80)
    assert "worst ceil(0.1 n)" in text and "own *validation* split" in text and "own held-out *test* split" in text
    out = pp.to_json(res, [], "personal")
    assert out["Ditto"]["seeds"][1]["personal"]["test_last10"] == pytest.approx(0.92)
    assert out["Ditto"]["seeds"][0]["personal"]["val_last10"] == pytest.approx(0.85)
    assert out["FedAvg"]["seeds"][0]["personal"]["key"] == "global/acc_mean"
    assert out["Ditto"]["seeds"][0]["personal"]["last10"]["global/acc_worst10pct"] == pytest.approx(0.3)
    json.dumps(out, default=str)
    assert "personal" not in pp.to_json(res)["Ditto"]["seeds"][0]  # the global protocol's JSON is unchanged
    pp.plot(s, res, tmp_path / "p.png")
    assert (tmp_path / "p.png").is_file()


def test_perplexity_columns_appear_with_token_data(tmp_path, monkeypatch):
    s = pp.load_study(study(tmp_path))
    runs = []
    for seed in range(2):
        r = personal_run([0.5] * 10, [0.5] * 10)
        for h in r.history:
            h.update({"personal/perplexity_mean": 4.0 + seed, "personal/perplexity_worst10pct": 9.0,
                      "global/perplexity_mean": 6.0, "global/perplexity_worst10pct": 12.0})
        runs.append(r)
    point = {"model.training.client_lr": 0.1}
    res = {name: {"grid": [(point, 0.5, runs[0])], "point": point, "runs": runs, "edge": [], "keys": ["model.training.client_lr"]}
           for name in ("FedAvg", "Ditto")}
    monkeypatch.setattr(pp, "git_head", lambda: "abc")
    lines = pp.section(s, res, "cmd", 60.0, (0.0, 0.0), quick=False)
    header = next(line for line in lines if line.startswith("| method"))
    assert "| personalized perplexity | personalized perplexity worst 10% | global-model perplexity mean / worst 10% |" in header
    row = next(line for line in lines if line.startswith("| Ditto |"))
    assert row.count("|") == header.count("|") and "| 4.50 ± 0.71 | 9.00 ± 0.00 | 6.00 ± 0.00 / 12.00 ± 0.00 |" in row


def test_recorder_keeps_the_per_client_metrics_and_old_cached_runs_still_load(tmp_path):
    import torch

    rec = paper_results.Recorder()
    rec.record_evaluation(10, {"test/acc": torch.tensor(0.5), "personal/acc_mean": torch.tensor(0.75),
                               "global_val/acc_worst10pct": 0.25, "personal_val/acc_std": torch.tensor(0.125),
                               "global/perplexity_mean": torch.tensor(3.5), "train/loss": torch.tensor(1.0)}, 100)
    row = rec.history[0]
    assert row["personal/acc_mean"] == 0.75 and row["global_val/acc_worst10pct"] == 0.25
    assert row["personal_val/acc_std"] == 0.125 and row["global/perplexity_mean"] == 3.5
    assert "train/loss" not in row and all(isinstance(v, float) for k, v in row.items() if "/" in k)
    # a cache entry written before the per-client keys were stored reads as before
    runner = paper_results.Runner(REPO, tmp_path / "w", lambda s: None, cache=tmp_path / "cache")
    configs, overrides = [REPO / "configs" / "quickstart.yaml"], ["--trainer.max_steps=2"]
    cached = runner._cache_file("old", runner._args(configs, overrides))
    cached.parent.mkdir(parents=True)
    old = {"name": "old", "history": [{"round": 2, "acc": 0.5, "val_acc": 0.4, "client_acc": None, "uploads": 10}],
           "summary": {"final/test_acc_last10pct": 0.5}, "seconds": 1.0, "args": [], "attention": None, "extra": {}}
    cached.write_text(json.dumps(old))
    run = runner.run("old", configs, overrides)
    assert run.history == old["history"] and run.last10 == 0.5
    assert pp.per_client_last10(run) == {}


def test_the_personal_studies_read(tmp_path):
    for name in ("personal_mnist_pathological", "personal_femnist"):
        s = pp.load_study(REPO / "configs" / "paper" / "grids" / f"{name}.yaml")
        assert s.metric == "personal" and s.reference == "FedAvg" and s.seeds == [0, 1, 2]
        assert [m.name for m in s.methods] == ["FedAvg", "FedAvg-FT", "Ditto", "FedRep", "FedPer", "FedBN", "APFL",
                                               "Per-FedAvg", "FedRoD"]  # issue 39's two families in both studies
        assert dataclasses.asdict(s)["metric"] == "personal"
