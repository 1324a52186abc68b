"""Personalized methods on 2 processes (DDP, Gloo on the CPU) end in the state of 1 process: Ditto's second
training, FedRep's body phase and APFL's step-by-step replay are engine calls split over the ranks like the
round's own, and their per-client state is replicated on every rank (ReplicaCheck)."""

from __future__ import annotations

import pytest
import torch
from test_distributed import _assert_same_state, _one_process, batch_of

CASES = {
    "ditto": ["--model.algorithm", "ditto", "--model.stragglers.p_incomplete", "0.5"],
    "fedrep": ["--model.algorithm", "fedrep", "--model.engine.client_state", "host"],
    "apfl": ["--model.algorithm", "apfl", "--model.stragglers.p_incomplete", "0.5"],
    "fedavg_ft": ["--model.algorithm", "fedavg_ft"],
}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Every case on the same 2 processes, one launch (test_distributed.batch_of)."""
    return batch_of(tmp_path_factory, CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_give_the_one_process_personalized_run(case, batch, tmp_path):
    extra = CASES[case]
    root, logs = batch
    assert "ReplicaCheck: the state of all 2 ranks was identical at each of 4 checks" in logs[case]
    ddp = torch.load(root / case / "ckpt" / "end.ckpt", map_location="cpu", weights_only=False)
    one = _one_process(tmp_path, [e for e in extra if e not in ("--model.engine.client_state", "host")], "one")
    one_state = {k: v.cpu() if torch.is_tensor(v) else v for k, v in one.model.state_dict().items()}
    _assert_same_state(ddp["state_dict"], one_state, f"{case}: 2 processes vs 1")
    assert ddp["lfed"]["runs"][0]["eval_history"] == one.model.eval_history
