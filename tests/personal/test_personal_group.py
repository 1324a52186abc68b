"""Personalized methods in a grid (lfed grid, RunGroup): each member equals its run alone bit for bit, with per-row
start weights (FedPer's local heads) merged into one engine call with the other plain rules."""

from __future__ import annotations

import pytest
import torch
from test_group import F64, alone, assert_members_equal_alone, config

pytestmark = pytest.mark.usefixtures("one_thread")  # bit for bit needs one intra-op thread


def test_personalized_members_equal_each_run_alone(tmp_path):
    """Ditto, FedPer, APFL and FedAvg-FT train their global models with plain rules: one engine call for the four
    per round (FedPer's rows start from each client's own head); FedRep's masked rule is a call of its own."""
    configs = [config("quickstart.yaml")]
    overrides = ["--trainer.max_steps=4", "--trainer.val_check_interval=2", "--data.partition=classes", *F64]
    group = assert_members_equal_alone(configs, {"model.algorithm": ["ditto", "fedper", "fedrep", "apfl", "fedavg_ft"]},
                                       overrides, tmp_path, merged_calls_per_round=2)
    for m in group.members:  # the personalized evaluation too
        _, module = alone(configs, m.params, overrides, tmp_path / "alone")
        mine, theirs = m.run.last_personal, module.runs[0].last_personal
        assert mine.keys() == theirs.keys() == {"clients", "global", "personal"}, m.name
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), m.name
