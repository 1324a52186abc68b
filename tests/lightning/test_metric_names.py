"""One name per metric (issue 51 item 13): ``client/acc_worst10`` became ``client/acc_worst10pct`` like ``global/`` and
``personal/acc_worst10pct`` (and ``client/perplexity_worst10`` ``client/perplexity_worst10pct``). lfed 0.5 logs each
under its new name and, deprecated until 0.6, under its old one with the same value (lfed.base.metric_gate.RENAMED);
the end-of-run table reads the new name, also from the rows of a checkpoint written by lfed 0.4."""

from __future__ import annotations

import csv
import shutil

import pytest
from conftest import REPO

from lfed.base.metric_gate import RENAMED, MetricGate, canonical_name
from lfed.lightning.cli import run_cli
from lfed.lightning.reporting import RoundTable


def test_the_renamed_metrics_and_their_deprecated_aliases():
    assert RENAMED == {"client/acc_worst10": "client/acc_worst10pct",
                       "client/perplexity_worst10": "client/perplexity_worst10pct"}
    assert canonical_name("client/acc_worst10") == "client/acc_worst10pct" and canonical_name("test/acc") == "test/acc"
    # either name in: both out, new first, the same value; every other metric as it is
    for given in ("client/perplexity_worst10", "client/perplexity_worst10pct"):
        out = MetricGate()({"test/acc": 0.5, given: 3.25})
        assert list(out.items()) == [("test/acc", 0.5), ("client/perplexity_worst10pct", 3.25), ("client/perplexity_worst10", 3.25)]
    # under DP the alias is gated as the metric is: dropped, or both marked unaccounted
    assert MetricGate("drop", ("test/*",))({"client/acc_worst10": 0.1, "test/acc": 0.5}) == {"test/acc": 0.5}
    assert MetricGate("mark")({"client/acc_worst10": 0.1}) == {"unaccounted/client/acc_worst10pct": 0.1,
                                                               "unaccounted/client/acc_worst10": 0.1}


def test_one_round_logs_the_new_names_and_the_old_as_equal_aliases(tmp_path, capsys):
    """configs/quickstart.yaml for one evaluated round: metrics.csv has client/acc_worst10pct and, with the same value,
    the deprecated client/acc_worst10 on the same row; the end table's worst-10% column is the new name's value."""
    cli = run_cli(["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--trainer.max_steps=1",
                   "--trainer.val_check_interval=1", "--trainer.enable_progress_bar=false", "--checkpoint_every=0",
                   f"--trainer.default_root_dir={tmp_path}"])
    (path,) = tmp_path.rglob("metrics.csv")
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("client/acc_worst10pct")]
    assert len(rows) == 1, "one evaluation, one row with the client accuracies"
    row = rows[0]
    new, old = float(row["client/acc_worst10pct"]), float(row["client/acc_worst10"])
    assert new == old and 0 <= new <= float(row["client/acc_mean"])
    logged = cli.trainer.callback_metrics
    assert float(logged["client/acc_worst10pct"]) == float(logged["client/acc_worst10"])
    # global/acc_worst10pct is the same figure on the evaluated clients S (all of them here), client/* on all clients
    assert float(row["global/acc_worst10pct"]) == pytest.approx(new, abs=1e-7)
    (table,) = [c for c in cli.trainer.callbacks if isinstance(c, RoundTable)]
    assert table.rows[-1]["client/acc_worst10pct"] == new and "client/acc_worst10" not in table.rows[-1]
    assert "client acc worst 10%" in capsys.readouterr().out


def test_a_0_4_checkpoints_table_rows_are_read_under_the_new_names(tmp_path):
    """tests/fixtures/checkpoint_0_4_adafl holds its end-table rows under client/acc_worst10; resumed, the table shows
    them in the worst-10% column (not '-'), beside the new round's row."""
    data = REPO / "tests" / "fixtures" / "checkpoint_0_4_adafl"
    ckpt = tmp_path / "last.ckpt"
    shutil.copy(data / "last.ckpt", ckpt)
    cli = run_cli(["fit", "--config", str(data / "config.yaml"), "--trainer.max_steps=5", "--trainer.val_check_interval=5",
                   "--checkpoint_every=0", "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path / 'a'}",
                   "--ckpt_path", str(ckpt)])
    (table,) = [c for c in cli.trainer.callbacks if isinstance(c, RoundTable)]
    assert [r["round"] for r in table.rows] == [2.0, 4.0, 5.0]
    assert all("client/acc_worst10pct" in r and "client/acc_worst10" not in r for r in table.rows)
    header, *body = table.table().splitlines()[1:]
    assert header.split()[-4:] == ["client", "acc", "worst", "10%"]  # the 5th column: rounds, test acc, loss, mean, worst
    assert [line.split()[4] for line in body] == [f"{r['client/acc_worst10pct']:.4f}" for r in table.rows], table.table()
