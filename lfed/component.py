"""The base of every piece of a round, and the cohort as the pieces see it.

A round (:func:`lfed.round.run_round`) is composed of components, one per role:

==============  ===========================================  =====================================
role            interface                                    SPEC
==============  ===========================================  =====================================
objective       :class:`lfed.client.objectives.ClientRule`   §2 local step rule and client state
weights         :class:`lfed.server.weighting.AggregationWeights`  §3 weights, partial work
combination     :class:`lfed.server.combination.ServerCombination` §4 mean, IGFL-S attention, ...
channel         :class:`lfed.server.channel.Channel`         §7 dense, ternary top-k with residuals
sampler         :class:`lfed.sampling.ClientSampler`         §5 uniform, AdaFL
participation   :class:`lfed.participation.Participation`    §5-§6 fraction schedule, stragglers
==============  ===========================================  =====================================

Each is an ``nn.Module`` (so YAML configs build it with ``class_path``/``init_args``) that
declares the tensors it keeps between rounds with :meth:`Component.state_specs`; the store
(:mod:`lfed.state`) allocates, saves, checks and fingerprints them. A component reads and
writes its state only through :meth:`Component.state`, :meth:`Component.rows` and
:meth:`Component.write_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from lfed.state import ModuleStateStore, StateSpec, StateStore

__all__ = ["Cohort", "Component", "LocalWork"]


@dataclass
class Cohort:
    """The clients of one round, as the components see them.

    Attributes:
        round: Round index r (0-based).
        clients: ``[K]`` client ids.
        num_examples: ``[K]`` client sizes ``n_k``.
        step_budget: ``[K]`` planned local steps ``T_k``.
        steps_done: ``[K]`` completed local steps ``s_k`` (0 = inactive).
        num_clients: ``N``, all clients.
        counting: ``[K]`` bool, the clients whose work counts (set once the weights are known).
        previous_update: ``[K, P]`` each client's update from the last round it took part in
            (zeros if none), when a component uses history.
        global_change: ``[P]`` ``w^r - w^{r-1}`` (zeros in round 0), with history.
    """

    round: int
    clients: Tensor
    num_examples: Tensor
    step_budget: Tensor
    steps_done: Tensor
    num_clients: int
    counting: Tensor | None = None
    previous_update: Tensor | None = None
    global_change: Tensor | None = None

    @property
    def active(self) -> Tensor:
        """``[K]`` bool: clients that did any local work (``s_k > 0``)."""
        return self.steps_done > 0


@dataclass
class LocalWork:
    """Where and how the cohort trained, for a client rule that needs more than the final weights.

    EFL computes its Fisher reports from it (:mod:`lfed.client.fisher`), split over the ranks
    like training and seeded by ``(seed, round)``.

    Attributes:
        engine: The :class:`~lfed.engine.CohortTrainer` of the model.
        ranks: The processes (:class:`~lfed.distributed.Ranks`).
        data_x, data_y: The pooled training tensors on the device.
        index: ``[K, max_n]`` positions of each cohort client's examples in ``data_x``.
        seed, round: Seed and round of every random draw.
    """

    engine: Any
    ranks: Any
    data_x: Tensor
    data_y: Tensor
    index: Tensor
    seed: int
    round: int


class Component(nn.Module):
    """Base of the pieces of a round: a name, hyper-parameters, declared state.

    Subclasses set :attr:`name`, override :meth:`state_specs` when they keep tensors between
    rounds, and list their hyper-parameters in :meth:`hparams` (they go into the run
    fingerprint: a resumed run with other values warns).
    """

    #: Short name used in logs and in the run fingerprint.
    name: str = "component"
    #: Whether the component reads :attr:`Cohort.previous_update` / :attr:`Cohort.global_change`.
    uses_history: bool = False

    def state_specs(self) -> list[StateSpec]:
        """The tensors this component keeps between rounds (none by default)."""
        return []

    def hparams(self) -> dict[str, Any]:
        """Hyper-parameters for the run fingerprint (none by default); a change warns on resume."""
        return {}

    def structure(self) -> dict[str, Any]:
        """Settings that make another algorithm (none by default); a change refuses a resume."""
        return {}

    # ---------------------------------------------------------------- state through the store
    def setup_state(self, store: StateStore, num_examples: Tensor, num_params: int, like: Tensor) -> None:
        """Allocate the declared state in ``store`` (called once the data and model are known)."""
        self._store = store
        store.allocate(self, self.state_specs(), num_examples, num_params, like)

    def _the_store(self) -> StateStore:
        store = self.__dict__.get("_store")
        if store is None:
            raise RuntimeError(f"{type(self).__name__}: state is not allocated yet (setup_state was not called)")
        return store

    def state(self, name: str) -> Tensor:
        """The whole tensor ``name`` (server state, or all rows of per-client state)."""
        return self._the_store().get(self, name)

    def set_state(self, name: str, value: Tensor) -> None:
        """Replace server tensor ``name`` in place."""
        self._the_store().set(self, name, value)

    def rows(self, name: str, clients: Tensor) -> Tensor:
        """The rows of ``clients`` of per-client tensor ``name``."""
        return self._the_store().rows(self, name, clients)

    def write_rows(self, name: str, clients: Tensor, values: Tensor, mask: Tensor | None = None) -> None:
        """Write rows of per-client tensor ``name``; with ``mask`` only the selected clients' rows."""
        self._the_store().write_rows(self, name, clients, values, mask)


def standalone_store() -> StateStore:
    """A store for a component used on its own (tests, notebooks)."""
    return ModuleStateStore()


def load_class(path: str, base: type, argument: str) -> type:
    """The class at dotted ``path`` (``"lfed.client.feddyn.FedDyn"``), checked to subclass ``base``.

    Raises:
        ValueError: Naming ``argument`` when the path cannot be imported or names another kind of class.
    """
    import importlib

    module_name, _, attr = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{argument}: cannot import {path!r} ({e})") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{argument}: {path!r} is not a {base.__name__}")
    return cls
