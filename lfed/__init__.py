"""lfed: federated learning on PyTorch Lightning.

``FederatedModule`` runs one federated round per training step; ``FederatedDataModule``
splits a dataset over simulated clients; ``CohortTrainer`` trains a cohort at once;
``FederatedRun`` is one run with no Lightning in it (``build_run`` builds it from settings, ``fit_run``
trains it), ``RunGroup`` many runs in lock-step. ``LocalTraining``, ``Stragglers``, ``Engine`` and
``Evaluation`` are the settings' groups (:mod:`lfed.settings`).

The names are imported when first used, so ``import lfed.round`` (a round as a function) or
``import lfed.run`` loads no Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public names and the modules that define them (imported on first use).
_LAZY = {
    "CohortTrainer": "lfed.engine",
    "StepRule": "lfed.engine",
    "FederatedRun": "lfed.run",
    "FederatedDataModule": "lfed.data.datamodule",
    "FederatedModule": "lfed.module",
    "RunGroup": "lfed.group",
    "build_run": "lfed.settings",
    "fit_run": "lfed.rounds",
    "LocalTraining": "lfed.round",
    "Stragglers": "lfed.stragglers",
    "Engine": "lfed.settings",
    "Evaluation": "lfed.settings",
}
_LIGHTNING = {"FederatedDataModule", "FederatedModule", "RunGroup"}

__all__ = sorted(_LAZY)
__version__ = "0.4.0"


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'lfed' has no attribute {name!r}")
    if name in _LIGHTNING:  # narrow filters for Lightning-internal messages (lfed.reporting), once Lightning is used
        from lfed.reporting import silence_library_noise

        silence_library_noise()
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
