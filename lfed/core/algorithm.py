"""The components of a run, one per role, and how its clients train: :class:`Algorithm`, :class:`LocalTraining`.

:class:`Algorithm` holds the round's components (one per role, :mod:`lfed.base.component`; the update history made
when a component reads it, :class:`UpdateHistory`); :func:`setup_state` allocates their declared state. The round
that runs them is :mod:`lfed.core.round`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from lfed.base.attack import NoAttack
from lfed.base.component import Cohort, Component, each_once
from lfed.base.declaration import Declaration, Supports, declaration
from lfed.base.sharing import SHARE_ALL, resolve_sharing
from lfed.client.objectives import ClientRule
from lfed.engine import steps_per_epoch
from lfed.participation.participation import Participation
from lfed.participation.sampling import ClientSampler
from lfed.server.channel import Channel
from lfed.server.combination import ServerCombination
from lfed.server.weighting import AggregationWeights
from lfed.state.spec import StateSpec

__all__ = ["Algorithm", "LocalTraining", "UpdateHistory", "setup_state"]


class UpdateHistory(Component):
    """Each client's update from the last round it took part in, and the global model's last change.

    IGFL-C's correction and time attention read it (components that declare ``Needs(history=True)``); the round
    keeps it: after the server step ``Δw_k ← Δ_k`` for active clients and ``Δw_ps ← w' - w``.
    """

    name = "history"
    declares = Declaration(supports=Supports(asynchronous="(a component reads the update history) is not defined asynchronously yet"))

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("previous_update"), StateSpec("global_change", per_client=False)]

    def fill(self, cohort: Cohort) -> None:
        cohort.previous_update = self.rows("previous_update", cohort.clients)
        cohort.global_change = self.state("global_change")

    def record(self, cohort: Cohort, updates: Tensor, w_old: Tensor, w_new: Tensor) -> None:
        self.write_rows("previous_update", cohort.clients, updates, mask=cohort.active)
        self.set_state("global_change", w_new - w_old)

    def start_round(self, cohort: Cohort) -> None:  # the round's hooks (lfed.base.component.Component)
        self.fill(cohort)

    def end_round(self, cohort: Cohort, updates: Tensor, w_old: Tensor, w_new: Tensor) -> None:
        self.record(cohort, updates, w_old, w_new)


@dataclass
class Algorithm:
    """The components of a round, one per role (see :mod:`lfed.base.component`).

    ``history`` is made when a component reads the update history (IGFL-C, time attention).
    """

    objective: ClientRule
    weighting: AggregationWeights
    combination: ServerCombination
    channel: Channel
    sampler: ClientSampler
    participation: Participation
    history: UpdateHistory | None = None
    sharing: Any = SHARE_ALL  # lfed.personal.sharing: Sharing, or SHARE_ALL (every parameter shared); Algorithm.attach
    asynchronous: Any = None  # lfed.core.asynchronous.Asynchronous: the round is a server step of FedBuff / FedAsync
    attack: Any = None  # lfed.robust.attacks.Attack: the run's Byzantine clients (None: NoAttack, none)

    def __post_init__(self) -> None:
        self.sharing = self.sharing or SHARE_ALL  # None (before 0.4): every parameter shared
        if self.attack is None:
            self.attack = NoAttack()
        if self.history is None and any(declaration(c).needs.history for c in self.roles().values()):
            self.history = UpdateHistory()

    def attach(self, net, layout) -> None:
        """Resolve the objective's partial sharing (:meth:`ClientRule.make_sharing`) for ``net``; before state is allocated.

        With a :class:`~lfed.personal.sharing.Sharing`, the round uploads, compresses, counts bits for,
        combines and server-steps only its shared coordinates; the objective keeps the local ones. Without
        one (``make_sharing`` returns None) it is :data:`~lfed.base.sharing.SHARE_ALL`.
        """
        self.sharing = resolve_sharing(self.objective, net, layout)

    def each(self) -> list[Component]:
        """Every component once (one component may hold two roles: FedDyn), in the order of :meth:`roles`."""
        return each_once(self.roles().values())

    def roles(self) -> dict[str, Component]:
        """``{role: component}`` of every component, in the order of the fields (the history when there is one; the
        attack only with Byzantine clients; the asynchronous schedule first; the sharing is not a component)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("sharing", "asynchronous")}
        if self.history is None:
            del out["history"]
        if not self.attack.present:  # a role only with Byzantine clients: a run without keeps its fingerprint
            del out["attack"]
        if self.asynchronous is not None:  # first: its refusals come before the other components' preparations
            out = {"asynchronous": self.asynchronous, **out}
        return out


@dataclass(frozen=True)
class LocalTraining:
    """How clients train: learning rate ``eta_l``, batch size, and the step budget ``T_k``.

    Attributes:
        client_lr: Client learning rate.
        batch_size: Mini-batch size ``B`` (None: full batch).
        local_epochs: Epochs ``E``; the budget is ``E * ceil(n_k / B)``.
        local_steps: A fixed budget of steps per round instead (None: epochs).
    """

    client_lr: float = 0.05
    batch_size: int | None = 10
    local_epochs: int = 1
    local_steps: int | None = None

    def __post_init__(self) -> None:
        from lfed.checks import integer, number

        object.__setattr__(self, "client_lr", float(number("client_lr", self.client_lr, above=0)))
        if self.batch_size is not None:
            integer("batch_size", self.batch_size, at_least=1, detail=" or None (full batch)")
        if self.local_steps is None:
            integer("local_epochs", self.local_epochs, at_least=1)
        else:
            integer("local_steps", self.local_steps, at_least=1, detail=" or None (local_epochs)")
            if self.local_epochs != 1:  # a fixed budget of steps replaces the epochs: both given, one would be ignored
                raise ValueError(f"local_epochs: {self.local_epochs} would be ignored, because local_steps: "
                                 f"{self.local_steps} sets a fixed budget of steps; give one of them")

    def step_budget(self, num_examples: Tensor) -> Tensor:
        """Planned local steps ``T_k``: ``local_steps``, or ``E * ceil(n_k / B)``."""
        if self.local_steps is not None:
            return torch.full_like(num_examples, self.local_steps)
        return self.local_epochs * steps_per_epoch(num_examples, self.batch_size)


def setup_state(algorithm: Algorithm, store, num_examples: Tensor, num_params: int, like: Tensor) -> None:
    """Allocate every component's declared state in ``store`` (each component once).

    With partial sharing (:attr:`Algorithm.sharing`, docs/algorithms.md §13) a component's ``"P"`` is the number of
    coordinates it handles (:meth:`~lfed.personal.sharing.Sharing.state_size`): the shared ones (``P_s``)
    for every role but the objective, the local ones (``P_l``) for the objective, whose rows hold each
    client's local part; without it, ``num_params`` for every role.
    """
    seen: set[int] = set()
    for role, component in algorithm.roles().items():
        if id(component) in seen:
            continue
        seen.add(id(component))
        if hasattr(store, "register_owner"):
            store.register_owner(role, component)
        P = algorithm.sharing.state_size(num_params, local=component is algorithm.objective)
        component.setup_state(store, num_examples, P, like)
