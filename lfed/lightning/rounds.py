"""The round schedule as Lightning's Trainer runs it: one training step is one round (``max_steps`` rounds, an
evaluation every ``val_check_interval`` rounds and after the last). Reads the Trainer; lives with the Lightning layer."""

from __future__ import annotations

from lfed.base.metric_gate import check_metric_name

__all__ = ["check_trainer_schedule", "request_final_evaluation"]


def check_trainer_schedule(trainer) -> None:
    """Refuse a round schedule that would crash or do nothing, before round 0.

    Raises:
        ValueError: If ``trainer.max_steps`` is 0 (no round would run), an integer
            ``trainer.val_check_interval`` is below 1, or a callback monitors a metric by its 0.4 name
            (``EarlyStopping(monitor="client/acc_worst10")``: not logged since 0.6, so it would wait for it in vain).
    """
    for callback in getattr(trainer, "callbacks", None) or []:
        check_metric_name(getattr(callback, "monitor", None), f"trainer.callbacks: {type(callback).__name__}.monitor")
    if getattr(trainer, "max_steps", -1) == 0:
        raise ValueError(
            "trainer.max_steps: 0 rounds would run (one training step is one federated round); "
            "set --trainer.max_steps to the number of rounds (>= 1). To evaluate a model without training, "
            "use `lfed validate` / `lfed test`."
        )
    interval = getattr(trainer, "val_check_interval", None)
    if isinstance(interval, int) and not isinstance(interval, bool) and interval < 1:
        raise ValueError(
            f"trainer.val_check_interval: evaluate every how many rounds; must be an int >= 1, got {interval} "
            "(the global model is always evaluated after the last round)"
        )


def request_final_evaluation(trainer) -> None:
    """After the last round, make Lightning evaluate whatever ``val_check_interval`` is (docs/algorithms.md §9).

    Lightning runs validation when a stop is requested (``trainer.should_stop``), so the last
    round asks for one: the run ends there anyway. Call from ``on_train_batch_end``.
    """
    max_steps = getattr(trainer, "max_steps", -1)
    if max_steps is not None and max_steps > 0 and int(trainer.global_step) >= max_steps:
        trainer.should_stop = True
