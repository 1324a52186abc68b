"""A component in a user's own file (examples/median_combination.py), outside the package, used
directly and through ``lfed fit --config`` with ``class_path`` (docs/extending.md)."""

from __future__ import annotations

import pytest
import torch
import yaml
from conftest import REPO, flat_weights, run_rounds
from test_client_objectives import BACKENDS, W_INIT, grad, toy_data, toy_module

from lfed.cli import run_cli


@pytest.fixture
def median(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import median_combination

    return median_combination.CoordinateMedian


def test_the_median_by_hand(median):
    from lfed.component import Cohort

    updates = torch.tensor([[1.0, -2.0], [5.0, 0.0], [3.0, 7.0], [100.0, 100.0]])
    cohort = Cohort(0, torch.arange(4), torch.ones(4), torch.ones(4), torch.ones(4), 4)
    cohort.counting = torch.tensor([True, True, True, False])  # the outlier's work does not count
    delta, _ = median().combine(updates, torch.full((4,), 0.25), cohort)
    assert delta.tolist() == [3.0, 0.0]
    cohort.counting = torch.tensor([True, True, True, True])  # even: mean of the two middle values
    assert median().combine(updates, torch.full((4,), 0.25), cohort)[0].tolist() == [4.0, 3.5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_median_in_a_round_by_hand(median, backend):
    m = toy_module("plain", backend, aggregation=median(), client_lr=0.1, local_steps=2)
    run_rounds(m, toy_data(), rounds=1)
    deltas = []
    for k in range(3):
        y = W_INIT.clone()
        for _ in range(2):
            y = y - 0.1 * grad(y, k)
        deltas.append(y - W_INIT)
    expected = W_INIT + torch.stack(deltas).median(dim=0).values  # three clients: the middle one
    torch.testing.assert_close(flat_weights(m), expected, atol=1e-13, rtol=0)
    assert m.composition["aggregation"] == "median"


def test_a_users_component_through_the_cli_with_class_path(median, tmp_path):
    cfg = tmp_path / "median.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"aggregation": {"class_path": "median_combination.CoordinateMedian"}}}))
    cli = run_cli(["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--config", str(cfg),
                   "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.logger=false",
                   "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"])
    assert type(cli.model.combination) is median and cli.trainer.global_step == 2
    assert torch.isfinite(flat_weights(cli.model)).all()
