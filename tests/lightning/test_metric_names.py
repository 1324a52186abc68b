"""One name per metric (issue 51 item 13): ``client/acc_worst10`` became ``client/acc_worst10pct`` like ``global/`` and
``personal/acc_worst10pct`` (and ``client/perplexity_worst10`` ``client/perplexity_worst10pct``). lfed 0.5 logged each
under both names, the old one deprecated until 0.6; 0.6 logs the new name only (issue 64), and where a user names a
metric (a declared private metric, a callback's ``monitor``, a sweep's ``metric.name``) the old name is refused before
round 0 in one line naming the new one (lfed.base.metric_gate.RENAMED, check_metric_name). The end-of-run table reads
the new name, also from the rows of a checkpoint written by lfed 0.4."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

from lfed.base.metric_gate import RENAMED, MetricGate, canonical_name, check_metric_name
from lfed.lightning.cli import main, run_cli
from lfed.lightning.reporting import RoundTable

QUICK = REPO / "configs" / "quickstart.yaml"


def refusal(old: str, where: str, new: str) -> str:
    return f"{where}: {old} is lfed 0.4's metric name, not logged since 0.6; it is {new} now"


def test_the_renamed_metrics_are_logged_under_their_new_names_only():
    assert RENAMED == {"client/acc_worst10": "client/acc_worst10pct",
                       "client/perplexity_worst10": "client/perplexity_worst10pct"}
    out = MetricGate()({"test/acc": 0.5, "client/perplexity_worst10pct": 3.25})
    assert list(out.items()) == [("test/acc", 0.5), ("client/perplexity_worst10pct", 3.25)]
    # under DP the metric is gated as any other: dropped, or marked unaccounted; no second name either way
    assert MetricGate("drop", ("test/*",))({"client/acc_worst10pct": 0.1, "test/acc": 0.5}) == {"test/acc": 0.5}
    assert MetricGate("mark")({"client/acc_worst10pct": 0.1}) == {"unaccounted/client/acc_worst10pct": 0.1}
    # what an old checkpoint recorded under an old name is read under the new one (the end table's rows, below)
    assert canonical_name("client/acc_worst10") == "client/acc_worst10pct" and canonical_name("test/acc") == "test/acc"


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_metric_name_is_refused_in_one_line_naming_the_new_one(old):
    new = RENAMED[old]
    for given, shown in ((old, new), (f"unaccounted/{old}", f"unaccounted/{new}"), (f"03-fedavg/{old}", f"03-fedavg/{new}")):
        with pytest.raises(ValueError) as refused:
            check_metric_name(given, "EarlyStopping.monitor")
        assert str(refused.value) == refusal(given, "EarlyStopping.monitor", shown)
    for fine in (new, "test/acc", f"{old}x", "client/*", None):  # the new name, others, patterns, nothing named
        check_metric_name(fine, "EarlyStopping.monitor")
    # a declared private metric (a component's, the run's own): refused when the run's gate is made, before round 0
    with pytest.raises(ValueError, match=f"^private_metrics: {old} is lfed 0.4's metric name.*it is {new} now$"):
        MetricGate("drop", ("test/*", old))
    assert MetricGate("drop", ("test/*", new)).is_private(new)


def test_a_callback_monitoring_an_old_name_is_refused_before_round_0(tmp_path, monkeypatch, capsys):
    """``lfed fit`` with EarlyStopping(monitor=client/acc_worst10): exit 2, the one line, no round run."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("LFED_DEBUG", raising=False)
    callbacks = '[{"class_path": "lightning.pytorch.callbacks.EarlyStopping", "init_args": {"monitor": "client/acc_worst10"}}]'
    monkeypatch.setattr(sys, "argv", ["lfed", "fit", "--config", str(QUICK), "--trainer.max_steps=1",
                                      "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}",
                                      f"--trainer.callbacks={callbacks}"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2
    assert err[-1] == "lfed fit: error: " + refusal("client/acc_worst10", "trainer.callbacks: EarlyStopping.monitor",
                                                    "client/acc_worst10pct")
    assert not list(tmp_path.rglob("*.ckpt"))  # no round ran


def test_a_sweep_ranking_by_an_old_name_is_refused(tmp_path):
    from lfed.lightning.sweep import load_sweep

    sweep = tmp_path / "s.yaml"
    body = "method: grid\nmetric:\n  name: {}\n  goal: maximize\nparameters:\n  model.training.client_lr:\n    values: [0.1]\n"
    sweep.write_text(body.format("client/acc_worst10"))
    with pytest.raises(ValueError) as refused:
        load_sweep(sweep)
    assert str(refused.value) == refusal("client/acc_worst10", f"sweep: {sweep}: metric.name", "client/acc_worst10pct")
    sweep.write_text(body.format("client/acc_worst10pct"))
    assert load_sweep(sweep).parameters == {"model.training.client_lr": [0.1]}
    for shipped in sorted((REPO / "sweeps").glob("*.yaml")):  # every sweep lfed ships ranks by a logged name
        load_sweep(shipped)


def test_one_round_logs_the_new_names_and_not_the_old(tmp_path, capsys):
    """configs/quickstart.yaml for one evaluated round: metrics.csv has client/acc_worst10pct and no column of the old
    name; the end table's worst-10% column is the new name's value."""
    cli = run_cli(["fit", "--config", str(QUICK), "--trainer.max_steps=1",
                   "--trainer.val_check_interval=1", "--trainer.enable_progress_bar=false", "--checkpoint_every=0",
                   f"--trainer.default_root_dir={tmp_path}"])
    (path,) = tmp_path.rglob("metrics.csv")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if r.get("client/acc_worst10pct")]
        columns = set(reader.fieldnames or ())
    assert len(rows) == 1, "one evaluation, one row with the client accuracies"
    assert not columns & set(RENAMED) and "client/acc_worst10pct" in columns
    new = float(rows[0]["client/acc_worst10pct"])
    assert 0 <= new <= float(rows[0]["client/acc_mean"])
    logged = cli.trainer.callback_metrics
    assert float(logged["client/acc_worst10pct"]) == new and not set(logged) & set(RENAMED)
    # global/acc_worst10pct is the same figure on the evaluated clients S (all of them here), client/* on all clients
    assert float(rows[0]["global/acc_worst10pct"]) == pytest.approx(new, abs=1e-7)
    (table,) = [c for c in cli.trainer.callbacks if isinstance(c, RoundTable)]
    assert table.rows[-1]["client/acc_worst10pct"] == new and "client/acc_worst10" not in table.rows[-1]
    assert "client acc worst 10%" in capsys.readouterr().out


def test_a_0_4_checkpoints_table_rows_are_read_under_the_new_names(tmp_path):
    """tests/fixtures/checkpoint_0_4_adafl holds its end-table rows under client/acc_worst10; resumed (its config's
    0.4 class path rewritten by scripts/upgrade_configs.py), the table shows them in the worst-10% column (not '-'),
    beside the new round's row."""
    data = REPO / "tests" / "fixtures" / "checkpoint_0_4_adafl"
    ckpt, config = tmp_path / "last.ckpt", tmp_path / "config.yaml"
    shutil.copy(data / "last.ckpt", ckpt)
    shutil.copy(data / "config.yaml", config)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "upgrade_configs.py"), str(config)], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    cli = run_cli(["fit", "--config", str(config), "--trainer.max_steps=5", "--trainer.val_check_interval=5",
                   "--checkpoint_every=0", "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path / 'a'}",
                   "--ckpt_path", str(ckpt)])
    (table,) = [c for c in cli.trainer.callbacks if isinstance(c, RoundTable)]
    assert [r["round"] for r in table.rows] == [2.0, 4.0, 5.0]
    assert all("client/acc_worst10pct" in r and "client/acc_worst10" not in r for r in table.rows)
    header, *body = table.table().splitlines()[1:]
    assert header.split()[-4:] == ["client", "acc", "worst", "10%"]  # the 5th column: rounds, test acc, loss, mean, worst
    assert [line.split()[4] for line in body] == [f"{r['client/acc_worst10pct']:.4f}" for r in table.rows], table.table()
