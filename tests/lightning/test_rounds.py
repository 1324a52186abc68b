"""lfed.lightning.rounds: the round schedule as the Trainer runs it (one training step is one round)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lfed.lightning.rounds import check_trainer_schedule, request_final_evaluation


def test_a_schedule_without_rounds_or_with_a_zero_interval_is_refused():
    with pytest.raises(ValueError, match=r"^trainer.max_steps: 0 rounds would run"):
        check_trainer_schedule(SimpleNamespace(max_steps=0, val_check_interval=10))
    with pytest.raises(ValueError, match=r"^trainer.val_check_interval: evaluate every how many rounds; must be an int >= 1, got 0"):
        check_trainer_schedule(SimpleNamespace(max_steps=5, val_check_interval=0))
    check_trainer_schedule(SimpleNamespace(max_steps=5, val_check_interval=1))  # fine
    check_trainer_schedule(SimpleNamespace(max_steps=-1, val_check_interval=True))  # a bool is no interval: Lightning's


@pytest.mark.parametrize("step, stops", [(3, False), (4, False), (5, True), (6, True)])
def test_the_last_round_asks_for_its_evaluation(step, stops):
    trainer = SimpleNamespace(max_steps=5, global_step=step, should_stop=False)
    request_final_evaluation(trainer)
    assert trainer.should_stop is stops


def test_a_run_without_an_end_in_steps_is_not_stopped():
    trainer = SimpleNamespace(max_steps=-1, global_step=10**6, should_stop=False)
    request_final_evaluation(trainer)
    assert trainer.should_stop is False
