"""FederatedModule: one federated round per Lightning training step (SPEC §1).

``automatic_optimization`` is off; each ``training_step`` runs :func:`lfed.round.run_round`
(sample a cohort, train it on the device with :class:`~lfed.engine.CohortTrainer`, combine
the updates) and the server optimizer's ``step()`` exactly once, so ``global_step == round`` and
Lightning's ``max_steps``, ``val_check_interval``, checkpointing, loggers and progress bar all
count rounds. The global model is ``self.net``; the round's components are submodules
(``objective``, ``weighting``, ``combination``, ``channel``, ``sampler``, ``participation``,
``history``) whose declared state (:mod:`lfed.state`) is in the state dict, so a checkpoint
resumes a run exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn

from lfed import algorithms
from lfed.client.objectives import ClientRule
from lfed.client_state import PLACEMENTS, ClientStateStore
from lfed.communication import CommunicationMeter, check_accuracy_targets
from lfed.distributed import Ranks, prepare_strategy
from lfed.engine import BACKENDS, CohortTrainer, as_per_example_loss
from lfed.evaluation import (
    BestMeanAccuracy,
    GlobalEvaluation,
    check_task,
    check_trainer_schedule,
    client_accuracies,
    is_classification,
    local_accuracy,
    request_final_evaluation,
    worst_share_mean,
)
from lfed.params import ParamLayout
from lfed.round import LocalTraining, run_round, setup_state
from lfed.sampling import ClientSampler, FractionSchedule
from lfed.server.channel import Channel
from lfed.server.combination import ServerCombination
from lfed.server.weighting import AggregationWeights
from lfed.validation import integer, number, one_of

#: Arguments that choose a component (a name, or a component object from ``class_path``).
COMPOSED = ("objective", "weighting", "partial_work", "aggregation", "compression", "sampler", "fraction", "server_optimizer")


class FederatedModule(LightningModule):
    """Federated training of one global model over simulated clients.

    Every argument left ``None`` comes from the preset ``algorithm`` (see
    :mod:`lfed.algorithms`); set any of them to compose your own algorithm, by name or as a
    component (``class_path``; see ``docs/extending.md``).

    Args:
        net: The global model (any ``nn.Module``). None builds lfed's MLP 2NN sized from the data.
        algorithm: Preset name (:data:`lfed.algorithms.PRESETS`): fedavg, fedavgm, fedadam, fedyogi,
            fedadagrad, fedprox, scaffold, igfl, igfl_c, igfl_s, igfl_s_self, igfl_s_global,
            igfl_s_time, dwfed, adafl, adafl_scaffold, adafl_fedprox, efl, feddyn.
        objective: Client rule (SPEC §2): plain, prox, scaffold, igfl, efl, or a ``ClientRule``.
        mu: FedProx proximal coefficient.
        efl_lambda: EFL elastic coefficient λ.
        fisher_samples: EFL examples per client for the Fisher diagonal.
        weighting: Aggregation weights (SPEC §3): size, uniform, dwfed, or an ``AggregationWeights``.
        partial_work: What stragglers' partial work counts for: keep, drop, scale (EFL T/s).
        aggregation: Server combination (SPEC §4): mean, or IGFL-S attention with query self,
            global or time; or a ``ServerCombination``.
        attention_temperature: Temperature τ of the attention softmax (ψ/τ), > 0.
        time_weights: Time attention's weights (SPEC §4): softmax (default) or diagonal (literal).
        compression: Sparsity q in (0, 1] of ternary compression with residuals (SPEC §7), or a
            ``Channel``; None takes the preset's choice (off for all but ``efl``); False: dense.
        sampler: Client sampler (SPEC §5): uniform, attention (AdaFL), or a ``ClientSampler``.
        sampler_alpha: AdaFL score decay α in [0, 1).
        fraction: Participation fraction C in (0, 1], or a schedule (lfed.sampling.StepwiseFraction ...).
        p_inactive: Probability that a sampled client does no work (SPEC §6).
        p_incomplete: Probability that a sampled client stops early.
        server_optimizer: Optimizer on the pseudo-gradient -Δ, e.g. ``torch.optim.SGD`` (lr=1 is FedAvg).
        client_lr: Client learning rate η_l.
        batch_size: Client mini-batch size B (None: full-batch).
        local_epochs: Local epochs E; the step budget is ``E * ceil(n_k / B)``.
        local_steps: Local steps per round instead of epochs (overrides ``local_epochs``).
        backend: CohortTrainer backend: auto, vmap, loop.
        chunk_size: Train at most this many clients at once (bounds memory).
        loss: Client loss (a torch.nn loss; cross-entropy by default).
        seed: Seed of sampling, stragglers, batches and Fisher draws (per round).
        accuracy_targets: Test accuracies for the "rounds (uploads) to reach" report.
        client_state: Where per-client rows of ``P`` numbers live (:mod:`lfed.client_state`):
            ``device`` (dense ``[N, P]`` buffers), ``host`` (lazy rows in CPU memory) or ``disk``
            (lazy rows in a memory-mapped file). Results are the same; checkpoints move between them.
        client_state_dir: Directory of the ``disk`` files (None: ``<trainer.default_root_dir>/client_state``).
    """

    def __init__(
        self,
        net: nn.Module | None = None,
        algorithm: algorithms.AlgorithmName = "fedavg",
        objective: Literal["plain", "prox", "scaffold", "igfl", "efl"] | ClientRule | None = None,
        mu: float = 0.01,
        efl_lambda: float = 0.1,
        fisher_samples: int = 64,
        weighting: Literal["size", "uniform", "dwfed"] | AggregationWeights | None = None,
        partial_work: Literal["keep", "drop", "scale"] | None = None,
        aggregation: Literal["mean", "self", "global", "time"] | ServerCombination | None = None,
        attention_temperature: float = 1.0,
        time_weights: Literal["softmax", "diagonal"] = "softmax",
        compression: float | bool | Channel | None = None,
        sampler: Literal["uniform", "attention"] | ClientSampler | None = None,
        sampler_alpha: float = 0.9,
        fraction: float | FractionSchedule | None = None,
        p_inactive: float = 0.0,
        p_incomplete: float = 0.0,
        server_optimizer: Callable[[Iterable], torch.optim.Optimizer] | None = None,
        client_lr: float = 0.05,
        batch_size: int | None = 10,
        local_epochs: int = 1,
        local_steps: int | None = None,
        backend: Literal["auto", "vmap", "loop"] = "auto",
        chunk_size: int | None = None,
        loss: nn.Module | None = None,
        seed: int = 0,
        accuracy_targets: list[float] | None = None,
        client_state: Literal["device", "host", "disk"] = "device",
        client_state_dir: str | None = None,
    ) -> None:
        super().__init__()
        given = dict(objective=objective, weighting=weighting, partial_work=partial_work, aggregation=aggregation,
                     compression=compression, sampler=sampler, fraction=fraction, server_optimizer=server_optimizer)
        objects = [k for k, v in given.items() if isinstance(v, nn.Module)]  # rebuilt from the config, not pickled
        self.save_hyperparameters(ignore=["net", "loss", *objects])
        self.automatic_optimization = False
        number("client_lr", client_lr, above=0)
        if batch_size is not None:
            integer("batch_size", batch_size, at_least=1, detail=" or None (full batch)")
        if local_steps is None:
            integer("local_epochs", local_epochs, at_least=1)
        else:
            integer("local_steps", local_steps, at_least=1, detail=" or None (local_epochs)")
        one_of("backend", backend, BACKENDS)
        one_of("client_state", client_state, PLACEMENTS)
        if client_state_dir is not None and client_state != "disk":
            raise ValueError(f"client_state_dir: only used with client_state='disk', got client_state={client_state!r}")
        number("sampler_alpha", sampler_alpha, at_least=0, below=1, detail=" (AdaFL's score decay α)")
        cfg = algorithms.resolve(algorithm, **given)
        self.explicit = {k for k, v in given.items() if v is not None}
        self.components = algorithms.build(
            cfg, mu=mu, efl_lambda=efl_lambda, fisher_samples=fisher_samples, attention_temperature=attention_temperature,
            time_weights=time_weights, sampler_alpha=sampler_alpha, p_inactive=p_inactive, p_incomplete=p_incomplete,
        )
        for role, component in self.components.roles().items():  # submodules: their state is in the state dict
            if any(m is component for m in self._modules.values()):  # one component in two roles (FedDyn): once
                object.__setattr__(self, role, component)
            else:
                setattr(self, role, component)
        self.algorithm = algorithm
        self.server_optimizer = cfg["server_optimizer"]
        self.training_plan = LocalTraining(float(client_lr), batch_size, local_epochs, local_steps)
        self.net, self.loss, self.loss_fn = net, loss, as_per_example_loss(loss)
        self.backend, self.chunk_size, self.seed = backend, chunk_size, seed
        self.accuracy_targets = check_accuracy_targets(accuracy_targets)
        self.comm = CommunicationMeter()
        self.eval_history: list[tuple[int, float]] = []
        self.fed = None  # FederatedData on the device, set on fit start
        self.engine: CohortTrainer | None = None
        self.store = ClientStateStore(client_state, client_state_dir)
        self.evaluation = GlobalEvaluation()
        self.val_evaluation = GlobalEvaluation()  # the server's validation split, when the data has one
        self.val_history: list[tuple[int, float]] = []
        self.bmta = BestMeanAccuracy()
        if net is not None:
            self.layout = ParamLayout.from_module(self.net)

    @property
    def composition(self) -> dict[str, Any]:
        """The names of the round's components (for logs, the fingerprint and composition checks)."""
        c = self.components
        return {"objective": c.objective.name, "weighting": c.weighting.name, "partial_work": c.weighting.partial_work,
                "aggregation": c.combination.name, "compression": c.channel.sparsity, "sampler": c.sampler.name,
                "fraction": c.participation.fraction}

    # ------------------------------------------------------------------ setup
    def _datamodule(self):
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None or not hasattr(dm, "build"):
            raise ValueError("FederatedModule needs a FederatedDataModule: trainer.fit(module, datamodule=FederatedDataModule(...))")
        return dm

    def setup(self, stage: str) -> None:
        """Build the default net if none was given and allocate every component's state for N clients."""
        data = self._datamodule().build()
        if self.net is None:
            from lfed.models import MLP

            outputs = data.num_classes if data.num_classes is not None else math.prod(data.train_y.shape[1:])
            self.net = MLP(in_features=math.prod(data.train_x.shape[1:]), num_classes=outputs)
            self.layout = ParamLayout.from_module(self.net)
        check_task(self.net, data, self.loss)  # the net's output against the classes / targets, before round 0
        like = next(self.net.parameters()).detach()
        if self.store.placement == "disk" and self.store.directory is None:
            self.store.directory = Path(self.trainer.default_root_dir) / "client_state"
        setup_state(self.components, self.store, data.client_sizes, self.layout.num_params, like)
        self.engine = CohortTrainer(self.net, self.loss, self.backend, self.chunk_size)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.server_optimizer([p for p in self.net.parameters() if p.requires_grad])

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def _device_data(self):
        if self.fed is None or self.fed.train_x.device != self.device:
            dtype = next(self.net.parameters()).dtype
            self.fed = self._datamodule().build().to(self.device, dtype)
        return self.fed

    def on_fit_start(self) -> None:
        from lfed.reporting import describe_optimizer

        prepare_strategy(self.trainer)
        check_trainer_schedule(self.trainer)
        d = self._device_data()
        if self.loss is None and d.task == "regression":
            raise ValueError("loss: the default (cross-entropy) needs class labels, but the targets are floating "
                             "(regression); give a regression loss, e.g. loss=torch.nn.MSELoss()")
        names = self.composition
        if names["weighting"] == "dwfed":
            d.require_labels("weighting='dwfed' (label-count weights)")
        for message in algorithms.validate_composition(  # settings that make no sense together
            names, self.explicit, p_inactive=self.participation.stragglers.p_inactive,
            p_incomplete=self.participation.stragglers.p_incomplete, mu=getattr(self.objective, "mu", None),
            efl_lambda=getattr(self.objective, "lam", None), num_clients=d.num_clients, total_rounds=self._total_rounds(),
        ):
            rank_zero_warn(message, category=algorithms.CompositionWarning)
        backend = self.engine.resolve_backend(d.train_x, d.train_y)
        rank_zero_info(
            f"lfed: {self.algorithm} on {d.num_clients} clients, {self.layout.num_params:,} parameters, backend={backend}, "
            + ", ".join(f"{k}={v}" for k, v in names.items()) + f", server_optimizer={describe_optimizer(self.server_optimizer)}"
        )

    # ------------------------------------------------------------------ one round
    def _total_rounds(self) -> int | None:
        ms = getattr(self.trainer, "max_steps", -1)
        return ms if ms and ms > 0 else None

    def server_step(self, optimizer: torch.optim.Optimizer) -> Callable[[Tensor], Tensor]:
        """``Δ -> w'``: ``optimizer`` steps once on the pseudo-gradient ``-Δ`` (SPEC §4.1); the new flat weights."""
        trainable = [p for p in self.net.parameters() if p.requires_grad]

        def step(delta: Tensor) -> Tensor:
            optimizer.zero_grad(set_to_none=True)
            for p, g in zip(trainable, self.layout.unflatten(-delta).values()):
                p.grad = g.clone()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return self.layout.module_vector(self.net)

        return step

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """One federated round (SPEC §1): :func:`lfed.round.run_round` and the server optimizer."""
        r = int(self.global_step)
        optimizer = self.optimizers()
        server_step = self.server_step(optimizer)
        _, rec = run_round(
            self.components, self.layout.module_vector(self.net), self._device_data(), self.training_plan, self.engine,
            round=r, seed=self.seed, total_rounds=self._total_rounds(), sizes=self.layout.sizes,
            server_step=server_step, ranks=Ranks.of(self),
        )
        self.last_round = rec
        for message in rec.warnings:
            rank_zero_warn(f"round {r}: {message}")
        if rec.skipped:
            rank_zero_warn(f"round {r}: no client's work counts (all inactive or dropped); the round is skipped")
            self.bmta.add_round(rec.cohort.clients, None)
            optimizer.zero_grad(set_to_none=True)
            optimizer.step()  # no gradients: advances the round counter only
            self.log("round/skipped", 1.0)
            # the cohort was sampled and sent the model, but nobody's upload counts
            self.log_dict(self.comm.record(0, bits_down=rec.bits_down))
            return
        if rec.result.buffers is not None:
            self._aggregate_buffers(rec.result.buffers, rec.weights)
        if rec.attention is not None:  # for lfed.callbacks.AttentionHeatmap
            self.last_attention, self.last_attention_clients, self.last_attention_round = rec.attention, rec.cohort.clients, r
        local = None  # bmta_local (SPEC §9): the counting participants' w_k_end on their own held-out splits
        counting, clients, d = rec.cohort.counting, rec.cohort.clients, self._device_data()
        if is_classification(d.train_y):
            local = local_accuracy(self.net, self.layout, rec.result.weights[counting], d, clients[counting])
        local_mean = self.bmta.add_round(clients, local)
        if local_mean is not None:
            self.log("client/local_acc_mean", local_mean)
        metrics = rec.metrics()
        if "train/loss" in metrics:
            self.log("train/loss", metrics.pop("train/loss"), prog_bar=True)
        self.log_dict(metrics)
        self.log_dict(self.comm.record(rec.uploads, bits_up=rec.bits_up, bits_down=rec.bits_down))

    def _aggregate_buffers(self, buffers: dict[str, Tensor], weights: Tensor) -> None:
        """Average floating buffers (BatchNorm running stats) with the normalised weights."""
        own = dict(self.net.named_buffers())
        a = weights / weights.sum()
        for name, stacked in buffers.items():
            if stacked.is_floating_point():
                own[name].copy_(torch.einsum("k,k...->...", a.to(stacked.dtype), stacked))
            else:
                own[name].copy_(stacked.max(0).values)

    # ------------------------------------------------------------------ evaluation (SPEC §9, lfed.evaluation)
    def on_validation_epoch_start(self) -> None:
        self.evaluation.reset()
        self.val_evaluation.reset()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        # with a validation split the loaders are [validation set, test set] (FederatedDataModule.val_dataloader)
        validation = dataloader_idx == 0 and self._device_data().has_validation
        (self.val_evaluation if validation else self.evaluation).update(self.net, self.loss_fn, *batch)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.evaluation.update(self.net, self.loss_fn, *batch)

    def on_test_epoch_start(self) -> None:
        self.on_validation_epoch_start()

    def on_test_epoch_end(self) -> None:
        self._end_eval("test")

    def on_validation_epoch_end(self) -> None:
        self._end_eval("val")

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        request_final_evaluation(self.trainer)  # the last round is always evaluated

    def _end_eval(self, stage: str) -> None:
        if self.evaluation.batches == 0 and not Ranks.of(self).distributed:
            return  # no batch was evaluated
        self.evaluation.bind(self.trainer.strategy)
        metrics = self.evaluation.compute(is_classification(self._device_data().test_y))
        self.log("test/loss", metrics["test/loss"])
        acc = metrics.get("test/acc")
        if acc is not None:
            self.log("test/acc", acc, prog_bar=True)
        per_client = self._client_accuracies()
        if per_client is not None:
            client = per_client[~torch.isnan(per_client)]
            self.log("client/acc_mean", float(client.mean()))
            self.log("client/acc_worst10", worst_share_mean(client, 0.1))
        val_acc = self._end_validation_split() if stage == "val" else None
        if stage == "val" and not self.trainer.sanity_checking and val_acc is not None:
            self.val_history.append((int(self.global_step), val_acc))
        if stage == "val" and not self.trainer.sanity_checking and acc is not None:
            self.eval_history.append((int(self.global_step), acc))
            self.comm.log_accuracy(acc)
            if per_client is not None:
                self.bmta.add_evaluation(per_client)

    def _end_validation_split(self) -> float | None:
        """Log ``val/loss`` and ``val/acc`` on the server's validation split; its accuracy (None without one)."""
        d = self._device_data()
        if not d.has_validation:
            return None
        self.val_evaluation.bind(self.trainer.strategy)
        metrics = self.val_evaluation.compute(is_classification(d.test_y))
        self.log("val/loss", metrics["test/loss"])
        acc = metrics.get("test/acc")
        if acc is not None:
            self.log("val/acc", acc)
        return acc

    def _client_accuracies(self) -> Tensor | None:
        ranks = Ranks.of(self)
        strategy = self.trainer.strategy if self._trainer is not None else None
        reduce = (lambda t: strategy.reduce(t, reduce_op="sum")) if ranks.distributed else (lambda t: t)
        return client_accuracies(self.net, self._device_data(), ranks.rank, ranks.world_size, reduce)

    def client_accuracy(self) -> Tensor | None:
        """Accuracy of the global model on each client's held-out split (clients with one)."""
        per_client = self._client_accuracies()
        return None if per_client is None else per_client[~torch.isnan(per_client)]

    # ------------------------------------------------------------------ end of run, checkpoints
    def last_rounds_accuracy(self, share: float = 0.1, split: str = "test") -> float | None:
        """Mean accuracy over the evaluations in the last ``share`` of rounds (IGFL's figure).

        ``split``: ``test`` (the global test set) or ``val`` (the server's validation split).
        """
        history = {"test": self.eval_history, "val": self.val_history}[split]
        if not history:
            return None
        last = history[-1][0]
        cutoff = last - max(1, math.ceil(share * last))
        accs = [a for r, a in history if r > cutoff]
        return sum(accs) / len(accs)

    def on_train_end(self) -> None:
        summary: dict[str, float] = {}
        last = self.last_rounds_accuracy()
        if last is not None:
            summary["final/test_acc_last10pct"] = last
        last_val = self.last_rounds_accuracy(split="val")
        if last_val is not None:
            summary["final/val_acc_last10pct"] = last_val
        for target in self.accuracy_targets:
            hit = self.comm.rounds_to_reach(target)
            if hit is not None:
                summary[f"final/rounds_to_{target:g}"] = hit[0]
                summary[f"final/uploads_to_{target:g}"] = hit[1]
        summary["final/uploads_total"] = self.comm.uploads
        summary.update(self.bmta.summary())
        if self.logger is not None and summary:
            self.logger.log_metrics(summary, step=int(self.global_step))
        self.final_summary = summary
        rank_zero_info("lfed: " + ", ".join(f"{k}={v:.4g}" for k, v in summary.items()))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from lfed.fingerprint import module_fingerprint

        checkpoint["lfed"] = {
            "comm": self.comm.state_dict(),
            "eval_history": list(self.eval_history),
            "val_history": list(self.val_history),
            "bmta": self.bmta.state_dict(),
            "fingerprint": module_fingerprint(self),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of another run (lfed.checkpoint.verify_fingerprint), then restore."""
        from lfed.fingerprint import module_fingerprint, verify_fingerprint

        state = checkpoint.get("lfed")
        verify_fingerprint((state or {}).get("fingerprint"), module_fingerprint(self))
        if state:
            self.comm.load_state_dict(state["comm"])
            self.eval_history = [tuple(x) for x in state["eval_history"]]
            self.val_history = [tuple(x) for x in state.get("val_history", [])]
            if "bmta" in state:
                self.bmta.load_state_dict(state["bmta"])
