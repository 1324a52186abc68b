"""Each run of a group its own logs: one Lightning logger that routes ``<name>/<metric>`` to the run's loggers.

The one driver (:class:`lfed.lightning.driver.FederatedDriver`) logs a group's metrics through Lightning
as ``<run name>/<metric>``; :class:`MemberLoggers`, the Trainer's logger for a group, hands each
run its own metrics under their plain names (``test/acc``), so each run has its own
``metrics.csv`` and its own W&B run, exactly as the run alone would (``lfed grid``, docs/grids.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.loggers import Logger

__all__ = ["MemberLoggers"]


class MemberLoggers(Logger):
    """Route metrics named ``<member>/<metric>`` to that member's loggers.

    Args:
        members: ``{member name: [its loggers]}``: Lightning loggers, or any object with
            ``log_metrics(metrics, step)`` (and optionally ``save()`` / ``finalize(status)``).
        save_dir: The group's directory.
    """

    def __init__(self, members: Mapping[str, Sequence[Any]], save_dir: str | None = None) -> None:
        super().__init__()
        self.members = {name: list(loggers) for name, loggers in members.items()}
        self._save_dir = save_dir

    @property
    def name(self) -> str:
        return "members"

    @property
    def version(self) -> str:
        return "0"

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Nothing: each member's loggers got its own settings when they were made."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        per_member: dict[str, dict[str, float]] = {}
        for key, value in metrics.items():
            name, _, metric = key.partition("/")
            if metric and name in self.members:
                per_member.setdefault(name, {})[metric] = value
        for name, values in per_member.items():
            for logger in self.members[name]:
                logger.log_metrics(values, step)

    def save(self) -> None:
        for loggers in self.members.values():
            for logger in loggers:
                if hasattr(logger, "save"):
                    logger.save()

    def finalize(self, status: str) -> None:
        for loggers in self.members.values():
            for logger in loggers:
                if hasattr(logger, "finalize"):
                    logger.finalize(status)
