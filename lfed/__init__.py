"""lfed: federated learning on PyTorch Lightning.

``FederatedModule`` runs one federated round per training step; ``FederatedDataset`` splits a
dataset over simulated clients (``FederatedDataModule``: the same as a Lightning data module); ``CohortTrainer`` trains a cohort at once;
``FederatedRun`` is one run with no Lightning in it (``build_run`` builds it from settings, ``fit_run``
trains it), ``RunGroup`` many runs in lock-step. ``LocalTraining``, ``Stragglers``, ``Engine`` and
``Evaluation`` are the settings' groups (:mod:`lfed.settings`).

The public API is five packages (docs/extending.md):

* ``lfed``: the drivers, the round as a function (:func:`run_round` and what builds its arguments),
  and what every component shares (:class:`Component`, :class:`Cohort`, :class:`LocalWork`,
  :class:`StateSpec`, ...);
* ``lfed.client``: client rules (:class:`~lfed.client.ClientRule`, ``Plain``, ``Prox``, ``Scaffold``,
  ``IGFL``, ``EFL``, ``FedDyn``) and what they return (``StepRule``, ``LossTerm``);
* ``lfed.server``: weighting, server combinations, channels, samplers, participation, server optimizers;
* ``lfed.personal``: personalized methods; ``lfed.privacy``: DP-FedAvg and its accountant.

Every name is imported when first used (a module-level ``__getattr__``), so ``import lfed`` loads
neither torch nor Lightning, and ``import lfed.round`` (a round as a function) or ``import lfed.run``
loads no Lightning.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: Public names and the modules that define them (imported on first use).
_LAZY = {
    # drivers and runs
    "FederatedModule": "lfed.module",
    "FederatedDataModule": "lfed.data.datamodule",
    "FederatedDataset": "lfed.data.federated",
    "FederatedData": "lfed.data.federated",
    "FederatedRun": "lfed.run",
    "RunGroup": "lfed.group",
    # a run from its settings, and its rounds without Lightning (lfed.settings, lfed.rounds)
    "build_run": "lfed.settings",
    "fit_run": "lfed.rounds",
    "Stragglers": "lfed.stragglers",
    "Engine": "lfed.settings",
    "Evaluation": "lfed.settings",
    # the round as a function (no Trainer) and what builds its arguments
    "run_round": "lfed.round",
    "prepare_round": "lfed.round",
    "finish_round": "lfed.round",
    "setup_state": "lfed.round",
    "Algorithm": "lfed.round",
    "LocalTraining": "lfed.round",
    "RoundRecord": "lfed.round",
    "CohortTrainer": "lfed.engine",
    "CohortResult": "lfed.engine",
    # what every component shares
    "Component": "lfed.component",
    "Cohort": "lfed.component",
    "HostCohort": "lfed.component",
    "LocalWork": "lfed.component",
    "CompositionContext": "lfed.component",
    "NOT_COMPUTED": "lfed.component",
    "StepRule": "lfed.engine",
    "LossTerm": "lfed.engine",
    "TermModel": "lfed.engine.term",
    "ParamLayout": "lfed.params",
    "StateSpec": "lfed.state",
    "GLOBAL": "lfed.state",
    "StateStore": "lfed.state",
    "ModuleStateStore": "lfed.state",
    "ClientStateStore": "lfed.client_state",
    "HookError": "lfed.validation",
    "CompositionWarning": "lfed.algorithms",
}
_LIGHTNING = {"FederatedDataModule", "FederatedModule", "RunGroup"}

__all__ = sorted(_LAZY)
__version__ = "0.4.0"


def _lazy_exports(package: str, table: dict[str, str], before: Callable[[str], None] | None = None):
    """A package's ``__getattr__`` and ``__dir__`` that import each of ``table``'s names from its module on first use.

    The value is cached in the package's namespace, so the module is imported once; a name not in
    ``table`` raises ``AttributeError`` (so ``from package import submodule`` still imports the submodule).
    """
    import sys

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before is not None:
            before(name)
        value = getattr(importlib.import_module(table[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *table})

    return __getattr__, __dir__


def _silence(name: str) -> None:
    if name in _LIGHTNING:  # narrow filters for Lightning-internal messages (lfed.reporting), once Lightning is used
        from lfed.reporting import silence_library_noise

        silence_library_noise()


__getattr__, __dir__ = _lazy_exports(__name__, _LAZY, _silence)
