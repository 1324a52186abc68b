"""benchmarks/studies/paper_protocol.py --group: runs trained together (lfed.lightning.group) record what the same runs
trained alone through Lightning record: evaluations (test, validation, client accuracy, uploads),
the final summary, the round diagnostics, divergence."""

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "studies"))
import paper_results  # noqa: E402

QUICK = REPO / "configs" / "quickstart.yaml"
IGFL = REPO / "configs" / "igfl_c_digits.yaml"


pytestmark = pytest.mark.usefixtures("one_thread")  # bit for bit needs one intra-op thread


def jobs():
    common = ["--trainer.max_steps=4", "--trainer.val_check_interval=2", "--data.validation_fraction=0.2",
              "--trainer.precision=64-true"]
    return [
        ("plain/lr0.05", [QUICK], [*common, "--model.training.client_lr=0.05"]),
        ("plain/lr0.3", [QUICK], [*common, "--model.training.client_lr=0.3"]),
        ("igfl/lr0.1", [IGFL], [*common, "--model.training.client_lr=0.1"]),  # another kind of step rule, amplification logged
        ("diverges", [QUICK], [*common, "--model.training.client_lr=1e300"]),
    ]


def test_runs_trained_together_record_what_the_runs_alone_record(tmp_path):
    alone = paper_results.Runner(REPO, tmp_path / "a", lambda s: None, cache=None)
    together = paper_results.Runner(REPO, tmp_path / "g", lambda s: None, cache=tmp_path / "cache")
    assert together.train_together(jobs()) == 4
    assert together.train_together(jobs()) == 0  # all recorded now
    reader = paper_results.Runner(REPO, tmp_path / "r", lambda s: None, cache=tmp_path / "cache")
    for name, configs, overrides in jobs():
        a = alone.run(name, configs, overrides)
        assert reader.is_cached(name, configs, overrides)
        g = reader.run(name, configs, overrides)  # read from the disk cache train_together wrote
        assert g.history == together.run(name, configs, overrides).history
        assert g.extra["group_size"] == 4
        if name == "diverges":
            assert "NaN or Inf" in a.extra["error"] and "NaN or Inf" in g.extra["error"]
            assert g.summary == {} and a.summary == {}
            continue
        assert [h["round"] for h in g.history] == [h["round"] for h in a.history] == [2, 4]
        for ha, hg in zip(a.history, g.history):
            assert hg["uploads"] == ha["uploads"]
            for key in ("acc", "val_acc", "client_acc"):  # Lightning's logged metrics are float32 tensors
                assert hg[key] == pytest.approx(ha[key], rel=1e-6), (name, key)
        assert g.summary.keys() == a.summary.keys()  # one summary, whatever drives the run
        assert g.summary["final/test_acc"] == pytest.approx(a.history[-1]["acc"], rel=1e-6)
        for key, value in a.summary.items():
            assert g.summary[key] == pytest.approx(value, abs=1e-12), (name, key)
        assert g.extra.keys() - {"group_size"} == a.extra.keys()
        for key, value in a.extra.items():
            assert g.extra[key] == pytest.approx(value, rel=1e-6), (name, key)
    assert "round/amplification_mean" in together.run(*jobs()[2]).extra
