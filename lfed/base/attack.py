"""The attack role's contract and its do-nothing default: the run's Byzantine clients and what an attack does with them
(docs/robustness.md §1). The attacks themselves are :mod:`lfed.robust.attacks`; the round reads only this module, as
it reads :mod:`lfed.base.sharing` for the sharing role.

An :class:`Attack` is a component of the run (``attack:``). It fixes its Byzantine clients once, from the run's seed
(``fraction`` of the population: ``round(fraction · N)`` clients drawn by ``(seed, "byzantine")``), or lets the
adversary control ``per_round`` clients of every cohort (its first rows: a uniform sampler's order is random). Each
round it marks them (:attr:`lfed.base.component.Cohort.byzantine`, on the device and the host) and may

* poison their training data before the engine trains (:meth:`Attack.training_data`: label flipping), and
* rewrite their rows of the cohort's updates ``[K, P]`` after local training, before the channel
  (:meth:`Attack.poison` → :meth:`Attack.craft`), reading the honest rows of the same round when it is omniscient.

What a Byzantine client sends is what the server receives and keeps (the update history, the sampler's view).
:class:`NoAttack` is the role's do-nothing default.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lfed.base.component import Cohort, Component
from lfed.base.declaration import Declaration, Supports
from lfed.checks import integer, number
from lfed.engine.host import device_rows, to_device
from lfed.rng import round_generator

__all__ = ["Attack", "NoAttack", "byzantine_set", "shared_copy"]

#: (what, id of the clean tensor, its settings) -> [(weak reference to the clean tensor, the partition, the copy)]
_COPIES: dict[tuple, list[tuple[Any, Tensor, Any]]] = {}


def shared_copy(what: tuple, clean: Tensor, partition: Tensor, make: Callable[[], Any]) -> Any:
    """A poisoned copy of the run's data made once per process for the same clean tensor, partition and settings
    ``what`` (the attack, its seed and set): runs of one grid with the same attack share it, so their clients train in
    one engine call (the group merges rows that train on the same tensors). ``make()`` builds it the first time."""
    global _COPIES
    _COPIES = {k: [e for e in v if e[0]() is not None] for k, v in _COPIES.items()}  # drop the collected
    key = (what, id(clean))
    for ref, index, copy in _COPIES.get(key, []):
        if ref() is clean and torch.equal(index, partition):
            return copy
    copy = make()
    _COPIES.setdefault(key, []).append((weakref.ref(clean), partition, copy))
    return copy


def byzantine_set(num_clients: int, fraction: float, seed: int) -> Tensor:
    """``[N]`` bool on the host: the ``round(fraction · N)`` Byzantine clients of a run, drawn from ``(seed, "byzantine")``."""
    m = round(fraction * num_clients)
    out = torch.zeros(num_clients, dtype=torch.bool)
    out[torch.randperm(num_clients, generator=round_generator(seed, 0, "byzantine"))[:m]] = True
    return out


class Attack(Component):
    """Byzantine clients and what they send (module docstring). A subclass overrides :meth:`craft` (model poisoning)
    or :meth:`training_data` (data poisoning), or both (a backdoor with model replacement).

    Args:
        fraction: The share of the population that is Byzantine, in ``[0, 1)``: a fixed set of ``round(fraction · N)``
            clients drawn from the run's seed.
        per_round: Instead: the number of each cohort's clients the adversary controls (its first rows).
    """

    name = "none"
    #: Whether the attack is a role of the run (:meth:`lfed.core.algorithm.Algorithm.roles`); only :class:`NoAttack` is not.
    present: bool = True
    #: Whether :meth:`craft` reads the honest clients' updates of the round (an omniscient adversary).
    omniscient: bool = False
    #: Whether the attack changes the Byzantine clients' training data (needs a fixed set: ``fraction``).
    poisons_data: bool = False
    declares = Declaration(supports=Supports(
        asynchronous="is simulated on a synchronous round's cohort; it is not defined in the asynchronous schedule"))

    def __init__(self, fraction: float = 0.0, per_round: int | None = None) -> None:
        super().__init__()
        self.fraction = number("fraction", fraction, at_least=0, below=1, detail=" (the Byzantine share of the clients)")
        if per_round is not None:
            integer("per_round", per_round, at_least=0, detail=" or None (a fixed set: fraction)")
            if self.fraction:
                raise ValueError(f"per_round: {per_round} and fraction: {fraction} both given; give one (per_round: "
                                 "the clients of each cohort the adversary controls; fraction: a fixed set)")
            if self.poisons_data:
                raise ValueError(f"per_round: {self.name} poisons its clients' training data, which needs a fixed set "
                                 "of Byzantine clients; give fraction instead")
        self.per_round = per_round
        self._set: tuple[int, int, Tensor] | None = None  # (N, seed, the set), made once
        self._copy: tuple[Any, int, Any] | None = None  # (weak reference to the clean tensor, seed, the poisoned copy)

    @property
    def active(self) -> bool:
        """Whether any client can be Byzantine."""
        return bool(self.fraction) or bool(self.per_round)

    def hparams(self) -> dict[str, Any]:
        out: dict[str, Any] = {"per_round": self.per_round} if self.per_round is not None else {"fraction": self.fraction}
        return out if self.active or type(self) is not NoAttack else {}

    def byzantine_clients(self, num_clients: int, seed: int) -> Tensor:
        """``[N]`` bool on the host: the run's fixed Byzantine set (:func:`byzantine_set`; empty with ``per_round``)."""
        if self._set is None or self._set[:2] != (num_clients, seed):
            self._set = (num_clients, seed, byzantine_set(num_clients, 0.0 if self.per_round is not None else self.fraction,
                                                          seed))
        return self._set[2]

    def check(self, context) -> list[str]:
        if self.active and self.poisons_data and getattr(context.data, "lazy", False):
            raise ValueError(f"attack={self.name!r} poisons the pooled training set, which a population made per client "
                             "(data.lazy) does not have; use data.lazy: false, or a model-poisoning attack")
        if type(self) is not NoAttack and not self.active:
            return [f"attack={self.name!r} has no Byzantine clients (fraction 0, no per_round), so it does nothing"]
        return []

    # ------------------------------------------------------------------ the round's hooks
    def start_round(self, cohort: Cohort) -> None:
        host = cohort.host_values()
        k = len(host.clients)
        if self.per_round is not None:
            byz = torch.arange(k) < self.per_round
        else:
            byz = self.byzantine_clients(cohort.num_clients, cohort.seed)[host.clients]
        host.byzantine = byz
        cohort.byzantine = to_device(byz, cohort.clients.device)

    def training_data(self, cohort: Cohort, data: Any, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """The training examples and labels the cohort trains on (``data``: the run's federated data); as given by default."""
        return x, y

    def poisoned_copy(self, cohort: Cohort, data: Any, clean: Tensor, what: tuple, make: Callable[[], Any]) -> Any:
        """The attack's poisoned copy of the run's training data for ``clean`` (the tensor it derives from): this
        instance's from an earlier round, else :func:`shared_copy`'s (one per process for the same clean tensor,
        partition and settings ``what``), built by ``make()`` the first time."""
        if self._copy is not None and self._copy[0]() is clean and self._copy[1] == cohort.seed:
            return self._copy[2]
        copy = shared_copy((type(self).__name__, cohort.seed, cohort.num_clients, self.fraction, *what), clean,
                           data.client_index, make)
        self._copy = (weakref.ref(clean), cohort.seed, copy)
        return copy

    def evaluation_metrics(self, data: Any, evaluate: Callable[[Tensor, Tensor], dict[str, float]]) -> dict[str, float]:
        """Metrics of the attack at each evaluation of the global model (a backdoor's success rate); ``evaluate(x, y)``
        scores the global model on ``x``, ``y`` (``test/acc``, ``test/loss``). None by default."""
        return {}

    def poison(self, updates: Tensor, cohort: Cohort) -> Tensor:
        """``updates [K, P]`` with the counting Byzantine rows replaced by :meth:`craft`'s (a new tensor; ``updates`` itself
        when the round has none)."""
        host = cohort.host_values()
        if host.byzantine is None or host.counting is None:
            return updates
        byz = host.byzantine & host.counting
        m = int(byz.sum())
        if m == 0 or type(self).craft is Attack.craft:
            return updates
        device = updates.device
        rows, honest = device_rows(byz, device), device_rows(host.counting & ~host.byzantine, device)
        crafted = self.craft(updates, rows, honest, cohort).to(updates.dtype)
        return updates.index_copy(0, rows, crafted.expand(m, updates.shape[1]))

    def craft(self, updates: Tensor, byzantine: Tensor, honest: Tensor, cohort: Cohort) -> Tensor:
        """What the Byzantine rows send: ``[m, P]``, or ``[P]`` sent by all of them. ``byzantine``, ``honest``: the rows
        (device long tensors) of the counting Byzantine and honest clients. Their own honest updates by default."""
        return updates.index_select(0, byzantine)

    def report(self, cohort: Cohort) -> dict[str, Tensor]:
        """``byzantine/counting``: the Byzantine clients whose update the round combined."""
        if cohort.byzantine is None or not self.active:
            return {}
        return {"byzantine/counting": (cohort.byzantine & cohort.counting).sum().to(torch.float32)}


class NoAttack(Attack):
    """No Byzantine clients (the default)."""

    name = "none"
    #: Whether the attack is a role of the run (a run without one keeps its fingerprint and its roles).
    present = False
    declares = Declaration(supports=Supports(asynchronous=True))

    def __init__(self) -> None:
        super().__init__(0.0, None)

    def start_round(self, cohort: Cohort) -> None:
        return None
