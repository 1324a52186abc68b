"""``lfed plot`` (lfed/evaluation/curves.py): several runs' metrics.csv drawn into one PNG, on hand-written files laid out
as runs lay them out (issue 66 item 1)."""

from __future__ import annotations

import math
import sys

import pytest

from lfed.evaluation.curves import PlotError, find_runs, main, plot_runs, read_metrics, run_labels

HEADER = "step,rounds_done,comm/uploads_total,test/acc,test/loss,train/loss\n"


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def runs(tmp_path):
    """Three runs as ``lfed fit`` lays them out: two versions of one configuration and one of another; evaluations every
    second round (``test/*`` empty in between), ``train/loss`` every round."""
    root = tmp_path / "runs"
    _write(root / "fedavg-digits-aaa" / "version_0" / "metrics.csv",
           HEADER + "0,1,5.0,,,2.0\n1,2,10.0,0.25,2.1,1.5\n2,3,15.0,,,1.25\n3,4,20.0,0.5,1.75,1.0\n")
    _write(root / "fedprox-digits-bbb" / "version_0" / "metrics.csv",
           HEADER + "0,1,5.0,,,2.5\n1,2,10.0,0.125,2.25,2.0\n2,3,15.0,,,1.5\n3,4,20.0,0.375,2.0,1.25\n")
    _write(root / "fedprox-digits-bbb" / "version_1" / "metrics.csv",
           HEADER + "0,1,5.0,,,2.5\n1,2,10.0,0.0625,2.5,2.25\n")
    return root


def _lines(ax):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_every_run_under_a_folder_is_one_line_per_metric_panel(runs, tmp_path):
    out = tmp_path / "figures" / "compare.png"
    fig = plot_runs([runs], ["test/acc", "test/loss"], output=out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels = ["fedavg-digits-aaa", "fedprox-digits-bbb/version_0", "fedprox-digits-bbb/version_1"]
    assert fig.lfed_series == {"test/acc": labels, "test/loss": labels} and fig.lfed_missing == {}
    acc, loss = fig.axes
    assert acc.get_ylabel() == "test/acc" and loss.get_ylabel() == "test/loss" and loss.get_xlabel() == "rounds done"
    assert _lines(acc) == {"fedavg-digits-aaa": ([2.0, 4.0], [0.25, 0.5]), "fedprox-digits-bbb/version_0": ([2.0, 4.0], [0.125, 0.375]),
                           "fedprox-digits-bbb/version_1": ([2.0], [0.0625])}  # only the rounds that were evaluated
    assert _lines(loss)["fedavg-digits-aaa"] == ([2.0, 4.0], [2.1, 1.75])
    assert [t.get_text() for t in acc.get_legend().get_texts()] == labels


def test_runs_named_one_by_one_keep_their_order_and_drop_a_version_no_other_run_shares(runs, tmp_path):
    files = find_runs([runs / "fedprox-digits-bbb" / "version_0", runs / "fedavg-digits-aaa" / "version_0" / "metrics.csv"])
    assert [f.parent.parent.name for f in files] == ["fedprox-digits-bbb", "fedavg-digits-aaa"]
    assert run_labels(files) == ["fedprox-digits-bbb", "fedavg-digits-aaa"]
    assert run_labels(files[:1]) == ["fedprox-digits-bbb"]
    assert len(find_runs([runs, runs / "fedavg-digits-aaa"])) == 3  # a file named twice is one run
    fig = plot_runs([runs / "fedavg-digits-aaa"], ["train/loss"], x="step", output=None, labels=["FedAvg"])
    assert _lines(fig.axes[0]) == {"FedAvg": ([0.0, 1.0, 2.0, 3.0], [2.0, 1.5, 1.25, 1.0])}
    assert fig.axes[0].get_xlabel() == "round (0-based)" and not (tmp_path / "curves.png").exists()


def test_a_growing_column_is_an_x_axis(runs):
    fig = plot_runs([runs], ["train/loss"], x="comm/uploads_total", output=None)
    assert _lines(fig.axes[0])["fedavg-digits-aaa"][0] == [5.0, 10.0, 15.0, 20.0]
    assert fig.axes[0].get_xlabel() == "comm/uploads_total"


def test_a_run_without_the_metric_is_left_out_of_its_panel_and_named(runs, tmp_path, capsys):
    _write(tmp_path / "runs" / "dp-digits-ccc" / "version_0" / "metrics.csv",
           "step,rounds_done,privacy/epsilon,test/acc\n0,1,0.5,\n1,2,0.75,0.25\n")
    fig = plot_runs([runs], ["privacy/epsilon", "test/acc"], output=None)
    assert fig.lfed_series["privacy/epsilon"] == ["dp-digits-ccc"]
    assert fig.lfed_missing == {"privacy/epsilon": ["fedavg-digits-aaa", "fedprox-digits-bbb/version_0", "fedprox-digits-bbb/version_1"]}
    assert len(fig.lfed_series["test/acc"]) == 4
    main([str(runs), "--metric", "privacy/epsilon", "-o", str(tmp_path / "eps.png")])
    out, err = capsys.readouterr()
    assert err.splitlines() == ["lfed plot: privacy/epsilon: not in fedavg-digits-aaa, fedprox-digits-bbb/version_0, "
                                "fedprox-digits-bbb/version_1 (left out of that panel)"]
    assert out.strip() == f"lfed plot: wrote {tmp_path / 'eps.png'} (privacy/epsilon of 1 run)"


def test_an_unknown_metric_is_one_line_naming_the_metrics_there_are(runs, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main([str(runs), "--metric", "test/acc", "--metric", "test/accuracy", "-o", str(tmp_path / "x.png")])
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == ["lfed plot: error: metric: test/accuracy is in no run's metrics.csv; the runs have: "
                                "comm/uploads_total, test/acc, test/loss, train/loss"]
    assert out == "" and not (tmp_path / "x.png").exists()


def test_an_unknown_x_axis_names_the_axes_the_runs_have(runs):
    with pytest.raises(PlotError, match=r"^x: 'clock/time' is not a column of fedavg-digits-aaa, .*; the x axes these runs have "
                                        r"are round, step, comm/uploads_total$"):
        plot_runs([runs], output=None, x="clock/time")


@pytest.mark.parametrize("given,message", [
    ("nowhere", r"^runs: .*nowhere does not exist$"),
    ("empty", r"^runs: no metrics\.csv in or under .*empty \(a run writes one"),
    ("other.csv", r"^runs: .*other\.csv is not a run's metrics\.csv \(it has no 'step' column; its columns: a, b\)$"),
    ("bad.csv", r"^runs: .*bad\.csv, line 3, column test/acc: 'high' is not a number$"),
])
def test_what_is_not_a_run_is_one_line(tmp_path, given, message):
    (tmp_path / "empty").mkdir()
    _write(tmp_path / "other.csv", "a,b\n1,2\n")
    _write(tmp_path / "bad.csv", "step,test/acc\n0,0.5\n1,high\n")
    with pytest.raises(PlotError, match=message):
        plot_runs([tmp_path / given], output=None)


def test_labels_must_match_the_runs(runs):
    with pytest.raises(PlotError, match=r"^label: 2 labels given for 3 runs"):
        plot_runs([runs], output=None, labels=["a", "b"])


def test_a_file_without_rounds_done_counts_rounds_from_step(tmp_path):
    table = read_metrics(_write(tmp_path / "metrics.csv", "step,test/acc\n0,\n1,0.5\n"))
    assert table["rounds_done"] == [1.0, 2.0] and math.isnan(table["test/acc"][0])


def test_without_matplotlib_it_says_what_to_install(runs, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # import of it fails as when not installed
    with pytest.raises(PlotError, match=r"^lfed plot draws with matplotlib, which does not import here \(.*\): pip install matplotlib$"):
        plot_runs([runs], output=None)
