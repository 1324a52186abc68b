"""lfed: federated learning on PyTorch Lightning.

``FederatedModule`` runs one federated round per training step; ``FederatedDataset`` splits a
dataset over simulated clients (``FederatedDataModule``: the same as a Lightning data module); ``CohortTrainer`` trains a cohort at once;
``FederatedRun`` is one run with no Lightning in it (``build_run`` builds it from settings, ``fit_run``
trains it), ``RunGroup`` many runs in lock-step. ``LocalTraining``, ``Stragglers``, ``Engine`` and
``Evaluation`` are the settings' groups (:mod:`lfed.core.settings`).

The public API is five packages (docs/extending.md):

* ``lfed``: the drivers, the round as a function (:func:`run_round` and what builds its arguments),
  and what every component shares (:class:`Component`, :class:`Cohort`, :class:`LocalWork`,
  :class:`StateSpec`, ...);
* ``lfed.client``: client rules (:class:`~lfed.client.ClientRule`, ``Plain``, ``Prox``, ``Scaffold``,
  ``IGFL``, ``EFL``, ``FedDyn``) and what they return (``StepRule``, ``LossTerm``);
* ``lfed.server``: weighting, server combinations, channels, samplers, participation, server optimizers;
* ``lfed.personal``: personalized methods; ``lfed.privacy``: DP-FedAvg and its accountant.

Every name is imported when first used (a module-level ``__getattr__``), so ``import lfed`` loads
neither torch nor Lightning, and ``import lfed.core.round`` (a round as a function) or ``import lfed.core.run``
loads no Lightning.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: Public names and the modules that define them (imported on first use).
_LAZY = {
    # drivers and runs
    "FederatedModule": "lfed.lightning.module",
    "FederatedDataModule": "lfed.lightning.datamodule",
    "FederatedDataset": "lfed.data.federated",
    "FederatedData": "lfed.data.federated",
    "FederatedRun": "lfed.core.run",
    "RunGroup": "lfed.lightning.group",
    # a run from its settings, and its rounds without Lightning (lfed.core.settings, lfed.core.fit)
    "build_run": "lfed.core.settings",
    "fit_run": "lfed.core.fit",
    "Stragglers": "lfed.participation.stragglers",
    "Engine": "lfed.core.settings",
    "Evaluation": "lfed.core.settings",
    # the round as a function (no Trainer) and what builds its arguments
    "run_round": "lfed.core.round",
    "prepare_round": "lfed.core.round",
    "finish_round": "lfed.core.round",
    "setup_state": "lfed.core.algorithm",
    "Algorithm": "lfed.core.algorithm",
    "LocalTraining": "lfed.core.algorithm",
    "RoundRecord": "lfed.core.record",
    "CohortTrainer": "lfed.engine",
    "CohortResult": "lfed.engine",
    # what every component shares
    "Component": "lfed.base.component",
    "Cohort": "lfed.base.component",
    "HostCohort": "lfed.base.component",
    "LocalWork": "lfed.base.component",
    "CompositionContext": "lfed.base.component",
    "NOT_COMPUTED": "lfed.base.component",
    "Declaration": "lfed.base.declaration",
    "Releases": "lfed.base.declaration",
    "Needs": "lfed.base.declaration",
    "Supports": "lfed.base.declaration",
    "StepRule": "lfed.engine",
    "LossTerm": "lfed.engine",
    "TermModel": "lfed.engine.term",
    "ParamLayout": "lfed.engine.params",
    "StateSpec": "lfed.state.spec",
    "GLOBAL": "lfed.state.spec",
    "StateStore": "lfed.state.spec",
    "ModuleStateStore": "lfed.state.spec",
    "ClientStateStore": "lfed.state.stores",
    "HookError": "lfed.checks",
    "CompositionWarning": "lfed.core.registry",
}

__all__ = sorted(_LAZY)
__version__ = "0.5.0"


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


# (the narrow filters for Lightning-internal messages are installed by lfed.lightning's own __init__, once Lightning is
# used: the root imports no package above it)
_exports, __dir__ = _lazy_exports(__name__, _LAZY)


def __getattr__(name: str) -> Any:
    """A public name, imported on first use (:data:`_LAZY`); a removed module (``lfed.round``, :data:`REMOVED`) is one
    line naming its new path."""
    if f"{__name__}.{name}" in REMOVED:
        raise AttributeError(removed_message(f"{__name__}.{name}"))
    return _exports(name)


# ---------------------------------------------------------------------- module paths that moved (docs/architecture.md)
#: lfed 0.4's module paths, moved in 0.5 and removed in 0.6 as 0.5 promised: ``old path -> new path``. Importing one
#: fails with one line naming the new path (:func:`removed_message`); the table stays to say so, and to read the class
#: paths an old checkpoint recorded as this lfed writes them (:func:`current_path`; a config file is refused instead,
#: and ``scripts/upgrade_configs.py`` rewrites it).
REMOVED = {
    "lfed.round": "lfed.core.round",
    "lfed.run": "lfed.core.run",
    "lfed.rounds": "lfed.core.fit",
    "lfed.schedule": "lfed.core.synchronous",
    "lfed.asynchronous": "lfed.core.asynchronous",
    "lfed.lockstep": "lfed.core.lockstep",
    "lfed.settings": "lfed.core.settings",
    "lfed.algorithms": "lfed.core.registry",
    "lfed.component": "lfed.base.component",
    "lfed.module": "lfed.lightning.module",
    "lfed.driver": "lfed.lightning.driver",
    "lfed.group": "lfed.lightning.group",
    "lfed.cli": "lfed.lightning.cli",
    "lfed.grid": "lfed.lightning.grid",
    "lfed.sweep": "lfed.lightning.sweep",
    "lfed.member_logs": "lfed.lightning.member_logs",
    "lfed.checkpoint": "lfed.lightning.checkpoint",
    "lfed.callbacks": "lfed.lightning.callbacks",
    "lfed.reporting": "lfed.lightning.reporting",
    "lfed.ddp": "lfed.lightning.ddp",
    "lfed.data.datamodule": "lfed.lightning.datamodule",
    "lfed.sampling": "lfed.participation.sampling",
    "lfed.stragglers": "lfed.participation.stragglers",
    "lfed.clock": "lfed.participation.clock",
    "lfed.communication": "lfed.evaluation.communication",
    "lfed.amplification": "lfed.evaluation.amplification",
    "lfed.adapters": "lfed.models.adapters",
    "lfed.distributed": "lfed.engine.ranks",
    "lfed.host": "lfed.engine.host",
    "lfed.params": "lfed.engine.params",
    "lfed.engine.schedule": "lfed.engine.batches",
    "lfed.client_state": "lfed.state.stores",
    "lfed.fingerprint": "lfed.state.fingerprint",
    "lfed.atomic": "lfed.state.atomic",
    "lfed.validation": "lfed.checks",
    "lfed.privacy.metrics": "lfed.base.metric_gate",
}
#: Modules that moved in 0.6 and later: ``old path -> new path``. An old path still imports (a config's ``class_path``,
#: a user's ``import``), says once where the module is now (a ``FutureWarning``), and gives the same objects, until the
#: release after the one it moved in (:data:`MOVED_IN`).
MOVED = {
    # names that say what the file holds, the layers (issue 64)
    "lfed.server.weights": "lfed.server.weight_formulas",
    "lfed.participation.cohorts": "lfed.participation.participation",
    "lfed.core.async_ready": "lfed.base.async_ready",
}
#: The release each old path of :data:`MOVED` moved in (0.6 unless listed); it works until the next one.
MOVED_IN = {"lfed.server.weights": "0.6", "lfed.participation.cohorts": "0.6", "lfed.core.async_ready": "0.6"}


def moved_message(old: str) -> str:
    """The one line an old module path of :data:`MOVED` says when imported."""
    release = MOVED_IN.get(old, "0.6")
    until = f"0.{int(release.split('.')[1]) + 1}"
    return f"{old} moved to {MOVED[old]} in lfed {release}; the old path works until {until}"


def removed_message(old: str) -> str:
    """The one line importing a removed module path of :data:`REMOVED` fails with."""
    return f"{old} was removed in lfed 0.6 (moved in 0.5); import {REMOVED[old]}"


def current_path(path: str) -> str:
    """``path`` (a module, or a name in one: ``lfed.sampling.AttentionSampler``) as this lfed spells it: an old module
    path of :data:`REMOVED` or :data:`MOVED` replaced by its new one (``lfed.participation.sampling.AttentionSampler``);
    anything else as given. Reads, never imports."""
    module = path
    while module:
        new = REMOVED.get(module) or MOVED.get(module)
        if new is not None:
            return new + path[len(module):]
        module = module.rpartition(".")[0]
    return path


def removed_path(path: str) -> str | None:
    """``path``'s new spelling when it is a removed module of :data:`REMOVED` or a name in one (a config's
    ``class_path: lfed.sampling.AttentionSampler``); None otherwise."""
    new = current_path(path)
    return new if new != path and not any(path == old or path.startswith(old + ".") for old in MOVED) else None


class MovedModule(type(importlib)):
    """An old module path of :data:`MOVED`: every attribute is the new module's (the same objects)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module(MOVED[self.__name__]), name)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(MOVED[self.__name__]))


class _MovedFinder:
    """Finds the old module paths for the import system: :data:`MOVED`'s import (with a warning), :data:`REMOVED`'s
    fail (a ``ModuleNotFoundError`` of one line naming the new path)."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in REMOVED:
            raise ModuleNotFoundError(removed_message(fullname))  # no name=: `from lfed import round` says it too
        if fullname not in MOVED:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _MovedFinder)

    @staticmethod
    def create_module(spec: Any) -> MovedModule:
        import warnings

        warnings.warn(moved_message(spec.name), FutureWarning, stacklevel=2)
        return MovedModule(spec.name)

    @staticmethod
    def exec_module(module: Any) -> None:
        pass


def _install_moved_finder() -> None:
    import sys

    if not any(f is _MovedFinder for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder)


_install_moved_finder()
