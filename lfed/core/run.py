"""One federated run, with no Lightning in it: its model, components, evaluation, summary and state.

A :class:`FederatedRun` is the whole life of one run (docs/algorithms.md §1, §9): set-up from the data
(:meth:`~FederatedRun.setup`, :meth:`~FederatedRun.start`), the end of each of its steps (:meth:`~FederatedRun.conclude`:
the step's one read from the device, the run's accounts, what it may release), its evaluation
(:meth:`~FederatedRun.evaluate`), the end-of-run summary (:meth:`~FederatedRun.summary`) and the state a checkpoint
carries beside its tensors (:meth:`~FederatedRun.extra_state`, with the run's fingerprint). It is an ``nn.Module``
whose submodules are the global model ``net`` and the components by role, so its declared state is in its state dict.

Its training step is told in one place, :func:`lfed.core.step.train_step`, with the run's schedule
(:attr:`FederatedRun.schedule`). The one driver, :class:`lfed.lightning.driver.FederatedDriver` (a LightningModule),
trains one run (:class:`lfed.lightning.module.FederatedModule`) or many in lock-step (:class:`lfed.lightning.group.RunGroup`,
``lfed grid``) through these; nothing here is written twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lfed.base.metric_gate import MetricGate
from lfed.core import registry as algorithms
from lfed.core.algorithm import Algorithm, LocalTraining, setup_state
from lfed.core.groups import Engine, Evaluation, as_group
from lfed.core.record import RoundRecord, verify_round
from lfed.core.run_evaluation import RunEvaluation
from lfed.core.synchronous import SYNCHRONOUS
from lfed.engine import CohortTrainer, as_per_example_loss
from lfed.engine.loop import has_running_stats
from lfed.engine.norm import check_batches_of_one
from lfed.engine.params import ParamLayout
from lfed.evaluation.communication import CommunicationMeter, check_accuracy_targets
from lfed.evaluation.scores import (
    BestMeanAccuracy,
    check_task,
)
from lfed.participation.sampling import DRAWS
from lfed.server.optimizers import apply_pseudo_gradient
from lfed.state.stores import ClientStateStore

__all__ = ["FederatedRun", "default_net"]


def data_notes(data) -> frozenset:
    """What the data says of its splits (:attr:`lfed.lightning.datamodule.FederatedData.notes`; none for other containers)."""
    return frozenset(getattr(data, "notes", ()) or ())


def default_net(data) -> nn.Module:
    """lfed's MLP 2NN sized from the data (the model when none is given)."""
    from lfed.models.zoo import MLP

    outputs = data.num_classes if data.num_classes is not None else math.prod(data.train_y.shape[1:])
    return MLP(in_features=math.prod(data.train_x.shape[1:]), num_classes=outputs)


class FederatedRun(RunEvaluation, nn.Module):
    """One federated run (module docstring).

    Args:
        components: The round's components (:class:`lfed.core.algorithm.Algorithm`).
        training_plan: How clients train (:class:`lfed.core.algorithm.LocalTraining`).
        server_optimizer: ``params -> torch.optim.Optimizer`` on the pseudo-gradient ``-Δ``.
        net: The global model (None: :func:`default_net` at :meth:`setup`).
        loss: The client loss (None: cross-entropy).
        seed: Seed of every draw of the run.
        engine: How the cohort is computed and where per-client state lives (:class:`lfed.core.groups.Engine`;
            None, or a dict of its fields: as :class:`~lfed.core.settings.RunSettings` takes it).
        evaluation: What an evaluation scores besides the global model (:class:`lfed.core.groups.Evaluation`: the
            personal and client samples, ``personal_chunk``, ``round_local_accuracy``, ``accuracy_targets``).
        algorithm: The preset's name; ``explicit``: the roles the user set (composition checks).
        name: The run's name in a group ('' for a run alone).
    """

    def __init__(self, components: Algorithm, training_plan: LocalTraining, server_optimizer: Callable, *,
                 net: nn.Module | None = None, loss: nn.Module | None = None, seed: int = 0,
                 engine: Engine | dict | None = None, evaluation: Evaluation | dict | None = None,
                 algorithm: str = "fedavg", explicit: frozenset = frozenset(), name: str = "") -> None:
        super().__init__()
        # each group checks its own values (naming them: evaluation.client_sample, engine.chunk_size, ...)
        self.engine_settings: Engine = as_group(engine, Engine, "engine")
        self.evaluation_settings: Evaluation = as_group(evaluation, Evaluation, "evaluation")
        self.last_personal: dict[str, Tensor] | None = None  # the last evaluation's per-client accuracies
        for role, component in components.roles().items():  # submodules: their state is in the state dict
            if any(m is component for m in self._modules.values()):  # one component in two roles (FedDyn): once
                object.__setattr__(self, role, component)
            else:
                setattr(self, role, component)
        self.components, self.training_plan, self.server_optimizer = components, training_plan, server_optimizer
        self.net, self.loss, self.loss_fn = net, loss, as_per_example_loss(loss)
        self.seed = seed
        self.accuracy_targets = check_accuracy_targets(self.evaluation_settings.accuracy_targets)
        self.store = ClientStateStore(self.engine_settings.client_state, self.engine_settings.client_state_dir)
        self.algorithm, self.explicit, self.name = algorithm, set(explicit), name
        self.layout = ParamLayout.from_module(net) if net is not None else None
        self.engine: CohortTrainer | None = None
        self.data = None  # the federated data on the device (:meth:`device_data`)
        self.datamodule = None
        self.comm = CommunicationMeter()
        self.eval_history: list[tuple[int, float]] = []
        self.val_history: list[tuple[int, float]] = []
        self.bmta = BestMeanAccuracy()
        self.status, self.error = "running", None
        self.rounds_done = 0
        self.final_summary: dict[str, float] = {}
        self.last_round = None  # the RoundRecord of the last round trained (callbacks read it)

    # the groups' settings under the names the run reads them by
    backend = property(lambda self: self.engine_settings.backend, doc="The engine's backend (``engine.backend``).")
    chunk_size = property(lambda self: self.engine_settings.chunk_size, doc="``engine.chunk_size``.")
    personal_clients = property(lambda self: self.evaluation_settings.personal_clients,
                                doc="``evaluation.personal_clients``.")
    personal_chunk = property(lambda self: self.evaluation_settings.personal_chunk, doc="``evaluation.personal_chunk``.")
    client_sample = property(lambda self: self.evaluation_settings.client_sample, doc="``evaluation.client_sample``.")
    round_local_accuracy = property(lambda self: self.evaluation_settings.round_local_accuracy,
                                    doc="``evaluation.round_local_accuracy``.")

    @property
    def private_metrics(self) -> tuple[str, ...]:
        """:attr:`server_held_metrics`, less those of a split that belongs to the training clients
        (:func:`lfed.lightning.datamodule.data_notes`: LEAF's test split is its writers' own held-out examples)."""
        notes = data_notes(self.data) if self.data is not None else frozenset()
        out = self.server_held_metrics
        if "test_from_clients" in notes:
            out = tuple(p for p in out if not p.startswith(("test/", "final/test_", "final/rounds_to_", "backdoor/")))
        if "val_from_clients" in notes:
            out = tuple(p for p in out if not p.startswith(("val/", "final/val_")))
        return out

    #: The run's own metrics computed on server-held data only (the test split, the server's validation split
    #: carved out before partitioning) or from public counts (rounds): what a DP run logs of them by default
    #: (:mod:`lfed.base.metric_gate`). Everything else the run logs reads the clients' data without noise.
    server_held_metrics: tuple[str, ...] = ("test/*", "val/*", "final/test_acc", "final/test_acc_last10pct",
                                        "final/val_acc_last10pct", "final/rounds_to_*", "backdoor/*")

    # ------------------------------------------------------------------ what it is
    @property
    def metric_gate(self) -> MetricGate:
        """What of the run's metrics may be logged, and under which names (:mod:`lfed.base.metric_gate`): all of them,
        unless a component guards them (DP-FedAvg)."""
        return MetricGate.of(self.components.roles().values(), self.private_metrics)

    @property
    def composition(self) -> dict[str, Any]:
        """The names of the round's components (logs, the fingerprint, composition checks)."""
        c = self.components
        out = {"objective": c.objective.name, "weighting": c.weighting.name, "partial_work": c.weighting.partial_work,
               "combination": c.combination.name, "channel": c.channel.sparsity, "sampler": c.sampler.name,
               "fraction": c.participation.fraction}
        if "attack" in c.roles():  # only a run with Byzantine clients names them (older fingerprints stay as they were)
            out["attack"] = c.attack.name
        out.update(self.schedule.composition())  # lfed.core.synchronous: asynchronous training's one line
        return out

    @property
    def schedule(self) -> Any:
        """When the server steps (:mod:`lfed.core.synchronous`): the asynchronous component (``model.asynchronous``), or
        synchronous rounds (:data:`~lfed.core.synchronous.SYNCHRONOUS`)."""
        return self.components.asynchronous if self.components.asynchronous is not None else SYNCHRONOUS

    @property
    def label(self) -> str:
        """The preset and each component it does not choose: ``fedavg+Prox``, ``fedavg+FedNova``
        (:func:`lfed.core.registry.composition_label`)."""
        parts = {**self.components.roles(), "asynchronous": self.components.asynchronous, "net": self.net}
        paths = {role: f"{type(c).__module__}.{type(c).__qualname__}" for role, c in parts.items() if c is not None}
        return algorithms.composition_label(self.algorithm, paths)

    # ------------------------------------------------------------------ set-up
    def setup(self, data, default_root_dir: str | Path | None = None,
              convert: Callable[[nn.Module], nn.Module] | None = None) -> None:
        """Build the default net if none was given, load a pretrained base (a submodule's ``load_pretrained()``,
        :class:`lfed.models.adapters.LoRA`) and allocate every component's state for the data's clients.

        ``convert``: puts the net in the run's precision first (Lightning's ``precision_plugin.convert_module``),
        so state is allocated, and a checkpoint restored, in that precision.
        """
        if self.net is None:
            self.net = default_net(data)
        if convert is not None:
            self.net = convert(self.net)
        for module in self.net.modules():  # a pretrained base from its file (lfed.models.adapters.LoRA), before any check of the net
            if callable(getattr(module, "load_pretrained", None)):
                module.load_pretrained()
        self.layout = ParamLayout.from_module(self.net)
        self.components.attach(self.net, self.layout)  # partial sharing (docs/algorithms.md §13), before state is allocated
        if self.components.asynchronous is not None:  # its slots keep each client's buffers (BatchNorm statistics) too
            self.components.asynchronous.attach(self.net)
        check_task(self.net, data, self.loss)  # the net's output against the classes / targets, before round 0
        if self.store.placement == "disk" and self.store.directory is None:
            self.store.directory = Path(default_root_dir or ".") / (f"client_state-{self.name}" if self.name else "client_state")
        like = next(self.net.parameters()).detach()
        setup_state(self.components, self.store, data.client_sizes, self.layout.num_params, like)
        # a sampler of random cohort sizes (Poisson) gives a new shape almost every round: recording one graph per
        # shape would cost more than its replays save (BENCHMARKS.md "DP beside pfl"), so its steps run eagerly
        self.engine = CohortTrainer(self.net, self.loss, self.backend, self.chunk_size,
                                    trace=self.components.sampler.fixed_size)

    def start(self, data, total_rounds: int | None) -> list[str]:
        """Checks before round 0 (``data``: on the device); the composition warnings to show."""
        self.data = data
        if self.loss is None and data.task == "regression":
            raise ValueError("loss: the default (cross-entropy) needs class labels, but the targets are floating "
                             "(regression); give a regression loss, e.g. loss=torch.nn.MSELoss()")
        dtype = next(self.net.parameters()).dtype
        lr = self.training_plan.client_lr
        if dtype.is_floating_point and lr > torch.finfo(dtype).max:  # the local step casts it to the model's dtype
            raise ValueError(f"client_lr: {lr:g} is beyond the range of the model's {dtype} (at most "
                             f"{torch.finfo(dtype).max:.3g}); give a learning rate the model's dtype can hold")
        # every component's one check (lfed.base.component.check_components), with the data
        warnings = algorithms.validate_composition(self.components, self.explicit, num_clients=data.num_clients,
                                                   total_rounds=total_rounds, net_releases=self.net_releases(),
                                                   run_key=self.stream_key(data), data_notes=data_notes(data),
                                                   training=self.training_plan,
                                                   shared_params=sum(self.components.sharing.shared_sizes_of(self.layout.sizes)),
                                                   data=data, seed=self.seed)
        # after the composition's refusals (DP-SGD refuses BatchNorm itself): a BatchNorm layer without spatial extent
        # cannot take a batch of one, refused here on both backends alike (lfed.engine.norm)
        x = data.train_x[:2]
        check_batches_of_one(self.net, x.to(dtype) if x.is_floating_point() else x,
                             data.host("client_sizes") if hasattr(data, "host") else data.client_sizes,
                             self.training_plan.batch_size)
        return warnings

    def depends_on_total_rounds(self) -> str | None:
        """What of the run depends on its horizon (``trainer.max_steps``): a fraction schedule over the run, a
        component's (DP's noise calibrated for the run's rounds), named; None when nothing does."""
        names = ["the fraction schedule"] if self.participation.fraction.depends_on_total_rounds else []
        names += [role for role, c in self.components.roles().items() if getattr(c, "depends_on_total_rounds", False)]
        return ", ".join(names) or None

    def notices(self) -> list[str]:
        """Lines to print at start-up (after :meth:`start`): where DP's noise comes from (a component's
        ``start_notice``), and which evaluation splits a DP run treats as client data."""
        out = [line for c in self.components.each() if callable(getattr(c, "start_notice", None))
               for line in c.start_notice().splitlines()]
        notes, gate = data_notes(self.data), self.metric_gate
        if gate.active and notes:
            shown = "logged as unaccounted/<name>" if gate.mode == "mark" else "not logged (log_unaccounted: true logs them as unaccounted/<name>)"
            splits = [s for s, n in (("test", "test_from_clients"), ("validation", "val_from_clients")) if n in notes]
            out.append(f"data: the {' and '.join(splits)} split of this dataset belongs to the training clients (LEAF's "
                       f"per-writer examples), so under DP its metrics are client data, not server-held: {shown}")
        return out

    def stream_key(self, data) -> str:
        """A digest of the run's settings except its seed (and the rounds): the composition, every component's
        hyper-parameters, the training plan, the net's layout and the clients' data (:func:`lfed.state.fingerprint.run_fingerprint`).
        DP's seeded noise streams are keyed by it (:class:`lfed.rng.PrivateStreams`): two runs of other settings at
        one seed (a grid's members) draw other noise; the same run alone or in a grid draws the same."""
        import hashlib

        from lfed.state.fingerprint import run_fingerprint, tensor_digest

        fp = {k: v for k, v in run_fingerprint(self, None, self.datamodule).items() if k != "hparams.seed"}
        # the sizes' digest the data keeps (hashed once: 80 MB at 10^7 clients), the same value as hashing them here
        fp["data.client_sizes"] = data.digests()["client_sizes"] if hasattr(data, "digests") else tensor_digest(data.client_sizes)
        return hashlib.blake2b(repr(sorted(fp.items())).encode(), digest_size=8).hexdigest()

    # ------------------------------------------------------------------ one round
    @property
    def running(self) -> bool:
        """Whether the run trains on: not ``diverged`` or ``stopped`` (``done`` after its last round, which more may follow)."""
        return self.status not in ("diverged", "stopped")

    def stop_reason(self, round: int, total_rounds: int | None) -> str | None:
        """Why the run must not train round ``round`` (a component's :meth:`~lfed.base.component.Component.stop_before`:
        DP's privacy budget), or None."""
        k = self.participation.cohort_size(round, total_rounds, self.data.num_clients)
        for component in self.components.each():
            reason = component.stop_before(round, k, self.data.num_clients)
            if reason:
                return reason
        return None

    def server_step(self, optimizer: torch.optim.Optimizer) -> Callable[[Tensor], Tensor]:
        """``Δ -> w'``: ``optimizer`` steps once on the pseudo-gradient ``-Δ`` (docs/algorithms.md §4.4); the new flat weights."""
        trainable = [p for p in self.net.parameters() if p.requires_grad]
        inner = getattr(optimizer, "optimizers", None)  # the driver's RunOptimizers (configure_optimizers()): its step ticks
        if isinstance(inner, list):
            if len(inner) != 1:
                raise ValueError(f"server_step: configure_optimizers() holds the server optimizers of {len(inner)} runs; "
                                 "give each run its own: run.server_step(optimizers.optimizers[i])")
            optimizer = inner[0]

        def step(delta: Tensor) -> Tensor:
            optimizer.zero_grad(set_to_none=True)
            apply_pseudo_gradient(optimizer, trainable, delta)
            optimizer.zero_grad(set_to_none=True)
            return self.layout.module_vector(self.net)

        return step

    def conclude(self, record: RoundRecord, metrics: dict[str, Any], w_before: Tensor) -> dict[str, float]:
        """The end of every step, whichever schedule ran it: the step's one read from the device (its metrics and
        finiteness flags, :func:`lfed.core.record.verify_round`), then the run's accounts: the last record, rounds done,
        ``bmta_local`` (docs/algorithms.md §9), communication (docs/algorithms.md §8). Returns the metrics the run may release
        (:mod:`lfed.base.metric_gate`). On NaN or Inf the net goes back to ``w_before`` (the last good model) and
        ``FloatingPointError`` is raised."""
        try:
            metrics = verify_round(record, metrics)
        except FloatingPointError:
            self.layout.load_into(self.net, w_before)
            raise
        self.last_round = record
        self.rounds_done = record.round + 1
        self.bmta.add_round_metrics(record.cohort.host_values().clients, metrics)
        metrics.update(self.comm.record(record.uploads, bits_up=record.bits_up, bits_down=record.bits_down))
        return self.metric_gate(metrics)

    def conclude_skipped(self, record: RoundRecord) -> dict[str, float]:
        """:meth:`conclude` for a round in which no client's work counts: the cohort was sampled and sent the model,
        but nobody's upload counts."""
        self.bmta.add_round(record.cohort.clients, None)
        self.last_round = record
        self.rounds_done = record.round + 1
        return self.metric_gate({"round/skipped": 1.0, **self.comm.record(0, bits_down=record.bits_down)})

    def diverged(self, error: Exception) -> dict[str, float]:
        """Stop the run (NaN or Inf); the metric that records it."""
        self.status, self.error = "diverged", str(error)
        return self.metric_gate({"run/diverged": 1.0})  # found in the clients' raw updates too: unaccounted under DP

    def net_releases(self) -> tuple[str, ...]:
        """What the run releases of the net beyond its parameters (a component's ``releases``, :mod:`lfed.privacy.releases`): the
        cohort's BatchNorm running statistics, averaged into the global model (:meth:`_aggregate_buffers`)."""
        if self.net is None or not has_running_stats(self.net):
            return ()
        names = [n for n, b in self.net.named_buffers() if b is not None and b.is_floating_point()]
        shown = ", ".join(names[:3]) + (f", ... {len(names)} buffers" if len(names) > 3 else "")
        return (f"the net's BatchNorm running statistics ({shown}) are averaged over the cohort's clients, un-noised, "
                "into the global model every round",)

    def aggregate_buffers(self, buffers: dict[str, Tensor], weights: Tensor) -> None:
        """The global model's buffers from the clients' ``{name: [K, ...]}`` (BatchNorm running statistics): the floating
        ones their mean with the normalised ``weights``, the others (``num_batches_tracked``) their largest. The one
        aggregation of buffers, whatever steps the server: a synchronous round's cohort (:mod:`lfed.core.synchronous`),
        an asynchronous server step's arrivals (:mod:`lfed.core.asynchronous`)."""
        own = dict(self.net.named_buffers())
        a = weights / weights.sum()
        for name, stacked in buffers.items():
            if stacked.is_floating_point():
                own[name].copy_(torch.einsum("k,k...->...", a.to(stacked.dtype), stacked))
            else:
                own[name].copy_(stacked.max(0).values)

    # ------------------------------------------------------------------ checkpoint state
    def extra_state(self) -> dict[str, Any]:
        """What a checkpoint carries beside the tensors: counters, histories, status."""
        return {"draws": self.draws, "comm": self.comm.state_dict(), "eval_history": list(self.eval_history),
                "val_history": list(self.val_history), "bmta": self.bmta.state_dict(),
                "status": self.status, "error": self.error, "name": self.name, "rounds_done": self.rounds_done}

    @property
    def draws(self) -> str:
        """How the run's cohorts are drawn (:data:`lfed.participation.sampling.DRAWS`): its components' setting."""
        return next((c.draws for c in self.components.each() if hasattr(c, "draws")), DRAWS[0])

    def set_draws(self, draws: str) -> None:
        """Draw cohorts as ``draws`` (:data:`lfed.participation.sampling.DRAWS`): every component that draws them."""
        if draws not in DRAWS:
            raise ValueError(f"draws: one of {DRAWS}, got {draws!r}")
        for c in self.components.each():
            if hasattr(c, "draws"):
                c.draws = draws

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`extra_state`. A checkpoint of lfed 0.5 or earlier (no ``draws``) goes on drawing its cohorts
        as it was made (``randperm``, :data:`lfed.participation.sampling.DRAWS`), so it resumes exactly."""
        self.set_draws(state.get("draws", "permutation"))
        self.comm.load_state_dict(state["comm"])
        self.eval_history = [tuple(x) for x in state["eval_history"]]
        self.val_history = [tuple(x) for x in state.get("val_history", [])]
        if "bmta" in state:
            self.bmta.load_state_dict(state["bmta"])
        self.status, self.error = state.get("status", "running"), state.get("error")
        self.rounds_done = int(state.get("rounds_done", 0))
