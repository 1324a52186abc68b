"""The base of every piece of a round, and the cohort as the pieces see it.

A round (:func:`lfed.core.round.run_round`) is composed of components, one per role; the roles, their base classes
and defaults are one table, :data:`lfed.core.registry.ROLE_TABLE` (drawn in docs/extending.md).

Each is an ``nn.Module`` (so YAML configs build it with ``class_path``/``init_args``) that
declares the tensors it keeps between rounds with :meth:`Component.state_specs`; the store
(:mod:`lfed.state.spec`) allocates, saves, checks and fingerprints them. A component reads and
writes its state only through :meth:`Component.state`, :meth:`Component.rows` and
:meth:`Component.write_rows`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from lfed.base.declaration import NOTHING, Declaration
from lfed.state.spec import GLOBAL, ModuleStateStore, StateSpec, StateStore, reading_read_only

__all__ = ["Cohort", "Component", "HostCohort", "CompositionContext", "LocalWork", "check_components", "each_once"]


def each_once(components: Iterable[Any]) -> list[Any]:
    """Every component of ``components`` once, in order of first appearance (one component may hold two roles: FedDyn
    is the objective and the combination): the one spelling of "each component once" for a run's roles."""
    return list({id(c): c for c in components}.values())


_NOT_COMPUTED_MESSAGE = ("cohort.start_loss: the round did not compute it; declare declares = Declaration(needs=Needs("
                         "start_loss=True)) (lfed.base.declaration; 0.5's needs_start_loss = True) on the component that "
                         "reads it, and the round computes each client's loss F_k(w) first")


class _NotComputed:
    """``cohort.start_loss`` of a round that did not compute it: reading it is fine (``dataclasses.replace`` copies
    it), any use of it (indexing, arithmetic, a tensor method, a torch function) raises the HookError naming
    ``Needs(start_loss=True)``."""

    __slots__ = ()

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        from lfed.checks import HookError

        raise HookError(_NOT_COMPUTED_MESSAGE)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe dunders: not a use
            raise AttributeError(name)
        self._fail()

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls._fail(None)

    def __repr__(self) -> str:
        return "<cohort.start_loss: not computed (no component declares Needs(start_loss=True))>"

    __getitem__ = __len__ = __iter__ = __bool__ = __float__ = __int__ = __neg__ = _fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _fail
    __pow__ = __rpow__ = __matmul__ = __rmatmul__ = __lt__ = __le__ = __gt__ = __ge__ = _fail


#: ``Cohort.start_loss`` when no component declares ``Needs(start_loss=True)`` (every use raises, naming it).
NOT_COMPUTED = _NotComputed()


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
            (zeros if none), when a component declares ``Needs(history=True)``.
        global_change: ``[P]`` ``w^r - w^{r-1}`` (zeros in round 0), with history.
        start_loss: ``[K]`` each client's mean training loss under the round's starting model
            ``F_k(w)``, when a component asks for it (``Needs(start_loss=True)``; q-FFL's weights).
        expected_size: The planned cohort size ``K_t`` of the round (``m = qN`` under Poisson sampling).
        seed: The run's seed: a component's own random stream is ``lfed.rng.round_generator(seed, round, name)``.
        host: The same cohort's host values (:class:`HostCohort`, CPU tensors read without a device sync,
            :mod:`lfed.engine.host`), or None for a cohort made by hand (then :meth:`host_values` makes them once).
        plan: The round's training plan (:class:`lfed.core.algorithm.LocalTraining`): ``plan.client_lr`` (the clients'
            learning rate η, q-FFL's ``L = 1/η``), ``batch_size``, ``local_epochs``, ``local_steps``.
        label_counts: ``[K, C]`` each cohort client's training label counts (on the device; ``[K, 0]`` for
            regression targets), for methods that weigh or correct by the clients' label distributions (FedLC).
        byzantine: ``[K]`` bool, the cohort's Byzantine clients (set by the run's attack, :mod:`lfed.robust.attacks`;
            all False without one); its host copy is :attr:`HostCohort.byzantine`.
        local_work: Once the cohort trained, the round's :class:`LocalWork` (where and how it trained), and
            ``start_model`` the round's global weights ``w [P]``: for a server combination that trains a model of its own
            (FLTrust's root set, :mod:`lfed.robust.rules.fltrust`).

    :attr:`start_loss` in a round that did not compute it (no component declares ``Needs(start_loss=True)``) is
    :data:`NOT_COMPUTED`: using it raises a :class:`~lfed.checks.HookError` naming the declaration.
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
    start_loss: Any = field(default_factory=lambda: NOT_COMPUTED, repr=False, compare=False)
    expected_size: float | None = None
    seed: int = 0
    host: HostCohort | None = None
    plan: Any = None
    label_counts: Tensor | None = None
    byzantine: Tensor | None = None
    local_work: Any = field(default=None, repr=False, compare=False)
    start_model: Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def active(self) -> Tensor:
        """``[K]`` bool: clients that did any local work (``s_k > 0``)."""
        return self.steps_done > 0

    def host_values(self) -> HostCohort:
        """The cohort's host values (:attr:`host`); made here once, with one device read, for a cohort made by hand."""
        if self.host is None:
            self.host = HostCohort(*(t.detach().cpu() for t in (self.clients, self.num_examples, self.step_budget,
                                                                self.steps_done)))
        if self.host.counting is None and self.counting is not None:
            self.host.counting = self.counting.detach().cpu()
        return self.host

    def host_agreement(self) -> Tensor | None:
        """``0-dim bool`` on the device: whether the device copies of the clients, sizes, budgets, steps done and
        counting mask equal their host copies (:attr:`host`), or None without host copies. Read with the round's
        other flags (:func:`lfed.core.record.verify_round`): a copy that drifted would make the components that read the
        host values (Per-FedAvg, FedRoD, the step counts) compute on other numbers than the engine."""
        from lfed.engine.host import to_device

        h = self.host
        if h is None:
            return None
        pairs = [(self.clients, h.clients), (self.num_examples, h.num_examples), (self.step_budget, h.step_budget),
                 (self.steps_done, h.steps_done)]
        for mask in ("counting", "byzantine"):
            if getattr(self, mask) is not None and getattr(h, mask) is not None:
                pairs.append((getattr(self, mask), getattr(h, mask)))
        # the host copies in one queued transfer (lfed.engine.host.to_device), compared with the device copies stacked there
        host = to_device(torch.stack([t.long() for _, t in pairs]), self.clients.device)
        return (torch.stack([t.long() for t, _ in pairs]) == host).all()



@dataclass
class HostCohort:
    """A cohort's clients, sizes, budgets, steps done and counting mask on the host (CPU tensors).

    They are known before anything goes to the device (the sampler and the straggler model draw on the
    host), so the round's checks and its step counts read them without waiting for the device (:mod:`lfed.engine.host`).
    """

    clients: Tensor
    num_examples: Tensor
    step_budget: Tensor
    steps_done: Tensor
    counting: Tensor | None = None
    byzantine: Tensor | None = None

    @property
    def active(self) -> Tensor:
        """``[K]`` bool on the host: clients that did any local work."""
        return self.steps_done > 0


@dataclass
class LocalWork:
    """Where and how the cohort trained, for a client rule that needs more than the final weights.

    EFL computes its Fisher reports from it (:mod:`lfed.client.fisher`), split over the ranks
    like training and seeded by ``(seed, round)``; Ditto trains each client's personal model
    with :meth:`train`.

    Attributes:
        engine: The :class:`~lfed.engine.CohortTrainer` of the model.
        ranks: The processes (:class:`~lfed.engine.ranks.Ranks`).
        data_x, data_y: The pooled training tensors on the device.
        index: ``[K, max_n]`` positions of each cohort client's examples in ``data_x``.
        seed, round: Seed and round of every random draw.
        num_examples: ``[K]`` the clients' sizes; ``steps_done``: ``[K]`` their local steps this round.
        lr: The round's client learning rate; ``batch_size``: its mini-batch size (None: full batch).
        plan: The run's training plan (:class:`lfed.core.algorithm.LocalTraining`: lr, batch size, epochs or steps).
        buffers: ``{name: [K, ...]}`` the cohort's final buffers (a net with running statistics, either backend), or None.
        host_num_examples, host_steps_done: The host copies of ``num_examples`` and ``steps_done``
            (:class:`HostCohort`): :meth:`train` hands them to the engine, which then reads no device value.
    """

    engine: Any
    ranks: Any
    data_x: Tensor
    data_y: Tensor
    index: Tensor
    seed: int
    round: int
    num_examples: Tensor | None = None
    steps_done: Tensor | None = None
    lr: float | None = None
    batch_size: int | None = None
    plan: Any = None
    buffers: dict[str, Tensor] | None = None
    host_num_examples: Tensor | None = None
    host_steps_done: Tensor | None = None

    def tiled(self, times: int) -> LocalWork:
        """The same clients ``times`` over, stacked (``times·K`` rows: client ``k`` at rows ``k, K + k, ...``).

        A rule that needs several models of each client through one engine call (APFL's ``[w; v̄]``, Per-FedAvg's
        ``w ± δ g``, FedRoD's generic and personalized rows) trains the tiled work with ``times·K`` start rows.
        """
        def tile(x):
            return None if x is None else torch.cat([x] * times)

        return replace(self, index=tile(self.index), num_examples=tile(self.num_examples),
                       steps_done=tile(self.steps_done), host_num_examples=tile(self.host_num_examples),
                       host_steps_done=tile(self.host_steps_done), buffers=None)

    def train(self, w_start: Tensor, rule: Any = None, *, steps: Tensor | None = None, lr: float | Tensor | None = None,
              stream: str = "extra", schedule: tuple[Tensor, Tensor] | None = None) -> Any:
        """A second local training of the cohort, split over the ranks like the round's own.

        Args:
            w_start: ``[P]`` or ``[K, P]`` per-client start weights (a personal model ``v_k``).
            rule: Its :class:`~lfed.engine.StepRule` (None: plain SGD).
            steps: ``[K]`` local steps (default: the steps each client did this round).
            lr: Learning rate (default: the round's), or ``[K]`` one per row.
            stream: The name of its batch stream: batches drawn from ``(seed, round, stream)``,
                independent of the round's own.
            schedule: Given batches ``(positions, valid)``, each ``[K, T, B']`` (:func:`lfed.engine.batch_schedule`)
                instead of the stream's (APFL replays the round's own batches step by step).

        Returns:
            The :class:`~lfed.engine.CohortResult` of every cohort client (the same on every rank).
        """
        from lfed.engine import StepRule
        from lfed.engine.job import TrainJob
        from lfed.engine.ranks import train_cohort
        from lfed.rng import round_generator

        host_n = self.host_num_examples  # a component that changed num_examples (APFL's doubled rows) without it: not used
        if host_n is not None and (self.num_examples is None or host_n.shape != self.num_examples.shape):
            host_n = None
        host_steps = self.host_steps_done if steps is None else None
        if host_steps is not None and (self.steps_done is None or host_steps.shape != self.steps_done.shape):
            host_steps = None
        job = TrainJob(w_start, self.data_x, self.data_y, self.index, self.num_examples,
                       self.steps_done if steps is None else steps, rule or StepRule(),
                       self.lr if lr is None else lr, self.batch_size, round_generator(self.seed, self.round, stream),
                       schedule, host_num_examples=host_n, host_steps_done=host_steps)
        return train_cohort(self.engine, self.ranks, job)


@dataclass
class CompositionContext:
    """What a component's check before round 0 sees (:meth:`Component.check`): the run's composition and data.

    Attributes:
        explicit: The roles the user set (a preset's own choices are not questioned).
        p_inactive, p_incomplete: The straggler model's probabilities (docs/algorithms.md §6).
        num_clients: ``N``; ``total_rounds``: the run's rounds (None when unknown).
        cohort_sizes: ``K_t`` of every round, when ``N`` and the rounds are known.
        components: Every component of the run by role.
        net_releases: What the run releases of the net beyond its parameters (BatchNorm running statistics
            averaged over the cohort: :meth:`lfed.core.run.FederatedRun.net_releases`), as a component's ``releases``
            (:mod:`lfed.privacy.releases`).
        run_key: A digest of the run's settings except its seed (:meth:`lfed.core.run.FederatedRun.stream_key`): DP's
            seeded noise streams are keyed by it, so runs of other settings never share noise (``""``: unknown).
        data_notes: What the run's data says of itself that a component may refuse or gate: ``test_from_clients``
            (the test split is the training clients' own held-out data, LEAF's), ``val_from_clients``.
        training: The run's training plan (:class:`lfed.core.algorithm.LocalTraining`: lr, batch size, budget), when known
            (example-level DP-SGD needs a batch size).
        shared_params: How many coordinates a client uploads (the shared part of the model), when known (distributed DP
            calibrates its noise for them).
        data: The run's federated data on the device (:class:`lfed.data.federated.FederatedData`), or None when the
            composition is checked without it (refuse data the component cannot use: ``data.require_labels(...)``).
        seed: The run's seed, for a component that draws outside a round's generators (a sampler's clock: its
            availability windows' phases, :class:`lfed.participation.availability.AvailableSampler`).
    """

    explicit: frozenset
    p_inactive: float = 0.0
    p_incomplete: float = 0.0
    num_clients: int | None = None
    total_rounds: int | None = None
    cohort_sizes: list[int] | None = None
    components: dict[str, Any] | None = None
    net_releases: tuple[str, ...] = ()
    run_key: str = ""
    data_notes: frozenset = frozenset()
    training: Any = None
    shared_params: int | None = None
    data: Any = None
    seed: int = 0


class Component(nn.Module):
    """Base of the pieces of a round: a name, hyper-parameters, declared state, a declaration, one check.

    Subclasses set :attr:`name`, override :meth:`state_specs` when they keep tensors between
    rounds, and list their hyper-parameters in :meth:`hparams` (they go into the run
    fingerprint: a resumed run with other values warns). What a component releases, needs and supports is its
    :attr:`declares` (:mod:`lfed.base.declaration`); what it checks before round 0 is its :meth:`check`.
    """

    #: Short name used in logs and in the run fingerprint.
    name: str = "component"
    #: What this component releases, needs and supports (:class:`lfed.base.declaration.Declaration`); a class
    #: attribute, or a property when it depends on the component's settings. Nothing by default.
    declares: Declaration = NOTHING

    def state_specs(self) -> list[StateSpec]:
        """The tensors this component keeps between rounds (none by default)."""
        return []

    def hparams(self) -> dict[str, Any]:
        """Hyper-parameters for the run fingerprint (none by default); a change warns on resume."""
        return {}

    @property
    def depends_on_total_rounds(self) -> bool:
        """Whether the run's rounds (``trainer.max_steps``) change what this component computes (DP's calibrated
        noise); then they go into the run fingerprint, and a resume with other rounds warns. False by default."""
        return False

    def structure(self) -> dict[str, Any]:
        """Settings that make another algorithm (none by default); a change refuses a resume."""
        return {}

    def check(self, context: CompositionContext) -> list[str]:
        """Before round 0, once: this component's check of its place in the run (``context``: the composition, the
        run's data as ``context.data`` when known).

        Raise ``ValueError`` naming the setting for what cannot run (DWFed's weights need class labels:
        ``context.data.require_labels(...)``; DP-FedAvg refuses a sampler its accountant cannot account for); derive
        settings (DP's calibration); return the settings that make this component do nothing or something else than
        its name says, one sentence each (the run shows them as :class:`lfed.core.registry.CompositionWarning`).
        Nothing by default.
        """
        return []

    def prepare_run(self, context: CompositionContext) -> None:
        """lfed 0.5's check hook (deprecated in 0.6: :meth:`check`); called, with a ``FutureWarning``, where overridden."""

    def check_start(self, data: Any) -> None:
        """lfed 0.5's check hook (deprecated in 0.6: :meth:`check`, the data as ``context.data``); called, with a
        ``FutureWarning``, where overridden."""

    def stop_before(self, round: int, cohort_size: int, num_clients: int) -> str | None:
        """A reason the run must stop before ``round`` (of planned cohort ``cohort_size`` of ``num_clients``), or None.

        The run then stops after the round before, with its final evaluation and a checkpoint (DP's
        privacy budget: the next round would spend more than ``target_epsilon``).
        """
        return None

    def start_round(self, cohort: Cohort) -> None:
        """Once the round's weights are known, before the step rule: what this component adds to the cohort for the
        other hooks (the update history's :attr:`Cohort.previous_update` and :attr:`Cohort.global_change`). Nothing by
        default."""

    def end_round(self, cohort: Cohort, updates: Tensor, w_old: Tensor, w_new: Tensor) -> None:
        """After the server step, before the sampler observes it: the cohort's updates ``[K, P]`` and the global model
        before and after (shared coordinates under partial sharing); the update history keeps them. Nothing by default."""

    def report(self, cohort: Cohort) -> dict[str, float]:
        """Scalars of this round to log, after the server step (none by default; DP's ``privacy/epsilon``)."""
        return {}

    def summary(self) -> dict[str, float]:
        """End-of-run figures of this component (``final/*``), shown in the run's end line and logged with its
        summary (none by default; DP-FedAvg's ε spent, δ and the noise multiplier z)."""
        return {}

    def composition_warnings(self, context: CompositionContext) -> list[str]:
        """lfed 0.5's check hook (deprecated in 0.6: :meth:`check` returns the warnings); called, with a
        ``FutureWarning``, where overridden."""
        return []

    # ---------------------------------------------------------------- state through the store
    def setup_state(self, store: StateStore, num_examples: Tensor, num_params: int, like: Tensor) -> None:
        """Allocate the declared state in ``store`` (called once the data and model are known)."""
        self._store = store
        specs = self.state_specs()
        starts = [StateSpec(f"{s.name}_started", shape=(), init=0.0, dtype=torch.bool) for s in specs if s.init == GLOBAL]
        specs = [replace(s, init=0.0) if s.init == GLOBAL else s for s in specs]
        store.allocate(self, specs + starts, num_examples, num_params, like)
        self._starts_global = {s.name[: -len("_started")] for s in starts}

    def _the_store(self) -> StateStore:
        store = self.__dict__.get("_store")
        if store is None:
            raise RuntimeError(f"{type(self).__name__}: state is not allocated yet (setup_state was not called)")
        return store

    def state(self, name: str) -> Tensor:
        """The whole tensor ``name`` (server state, or all rows of per-client state)."""
        return self._the_store().get(self, name)

    def set_state(self, name: str, value: Tensor) -> None:
        """Replace server tensor ``name`` (a new tensor: what :meth:`state` returned before keeps its value)."""
        self._the_store().set(self, name, value)

    def rows(self, name: str, clients: Tensor, first: Tensor | None = None) -> Tensor:
        """The rows of ``clients`` of per-client tensor ``name``.

        For state declared with ``init="global"`` (:data:`lfed.state.spec.GLOBAL`), ``first`` is the
        value of a client that has no row yet (the round's global model ``w``: ``[P]``, or ``[K, P]``).
        """
        store = self._the_store()
        rows = store.rows(self, name, clients)
        if name not in self.__dict__.get("_starts_global", ()):
            return rows
        if first is None:
            raise ValueError(f"{type(self).__name__}: state {name!r} starts as the global model (StateSpec init='global'); "
                             f"read it with self.rows({name!r}, clients, first=w)")
        started = store.rows(self, f"{name}_started", clients).to(rows.device)
        if rows.device.type == "cpu" and reading_read_only() and bool(started.all()):
            return rows  # every row was written: as read (a view, under read_only_rows: no copy)
        return torch.where(started.view(-1, *[1] * (rows.dim() - 1)), rows, first.to(rows.dtype).expand_as(rows))

    def write_rows(self, name: str, clients: Tensor, values: Tensor, mask: Tensor | None = None) -> None:
        """Write rows of per-client tensor ``name``; with ``mask`` only the selected clients' rows."""
        store = self._the_store()
        store.write_rows(self, name, clients, values, mask)
        if name in self.__dict__.get("_starts_global", ()):
            store.write_rows(self, f"{name}_started", clients, torch.ones(clients.numel(), dtype=torch.bool, device=clients.device), mask)


def check_components(components: Iterable[Any], context: CompositionContext) -> list[str]:
    """Every component's :meth:`Component.check` before round 0, once each, in order (the first refusal raises); the
    warnings, in order. A component written for lfed 0.5 has its hooks called around it, in 0.5's order
    (``check_start`` with the data, ``prepare_run``, ``composition_warnings``; :mod:`lfed.base.legacy`)."""
    from lfed.base.legacy import legacy_hooks

    out: list[str] = []
    for component in each_once(components):
        old = legacy_hooks(component)
        if "check_start" in old and context.data is not None:
            component.check_start(context.data)
        said = component.check(context)
        if said is None:
            said = []
        if isinstance(said, str) or not all(isinstance(m, str) for m in said):
            raise ValueError(f"{type(component).__name__}.check: must return a list of warnings (strings), got {said!r}")
        out += list(said)
        if "prepare_run" in old:
            component.prepare_run(context)
        if "composition_warnings" in old:
            out += list(component.composition_warnings(context) or [])
    return out


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
