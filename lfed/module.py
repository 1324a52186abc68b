"""FederatedModule: one federated round per Lightning training step (SPEC §1).

``automatic_optimization`` is off; each ``training_step`` samples a cohort, trains it on the
device with :class:`~lfed.engine.CohortTrainer`, aggregates the updates on the server and calls
the server optimizer's ``step()`` exactly once, so ``global_step == round`` and Lightning's
``max_steps``, ``val_check_interval``, checkpointing, loggers and progress bar all count
rounds. The global model is ``self.net``; every per-client tensor is a buffer of this module
(or of its objective / sampler), so a checkpoint resumes a run exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn

from lfed import algorithms
from lfed.client.objectives import Cohort, build_objective, check_state_shapes
from lfed.distributed import Ranks, fisher_cohort, prepare_strategy, train_cohort
from lfed.evaluation import BestMeanAccuracy, GlobalEvaluation, check_task, check_trainer_schedule, client_accuracies, is_classification, local_accuracy, request_final_evaluation, worst_share_mean
from lfed.engine import BACKENDS, CohortTrainer, as_per_example_loss, steps_per_epoch
from lfed.params import ParamLayout
from lfed.rng import round_generator, seeded_global_rng
from lfed.sampling import SAMPLERS, AttentionSampler, FractionSchedule, as_schedule, cohort_size
import warnings

from lfed.server.weights import PARTIAL_WORK, WEIGHT_RULES, DegenerateWeightsWarning, aggregation_weights, counting_mask
from lfed.stragglers import Stragglers
from lfed.communication import CommunicationMeter, check_accuracy_targets

AGGREGATIONS = ("mean", "self", "global", "time")


class FederatedModule(LightningModule):
    """Federated training of one global model over simulated clients.

    Every argument left ``None`` comes from the preset ``algorithm`` (see
    :mod:`lfed.algorithms`); set any of them to compose your own algorithm.

    Args:
        net: The global model (any ``nn.Module``). None builds lfed's MLP 2NN sized from the data.
        algorithm: Preset name: fedavg, fedavgm, fedadam, fedyogi, fedadagrad, fedprox, scaffold,
            igfl, igfl_c, igfl_s, igfl_s_self, igfl_s_global, igfl_s_time, dwfed, adafl,
            adafl_scaffold, adafl_fedprox, efl.
        objective: Local objective: plain, prox, scaffold, igfl, efl (SPEC §2).
        mu: FedProx proximal coefficient.
        efl_lambda: EFL elastic coefficient λ.
        fisher_samples: EFL examples per client for the Fisher diagonal.
        weighting: Aggregation weights: size, uniform, dwfed (SPEC §3).
        partial_work: What stragglers' partial work counts for: keep, drop, scale (EFL T/s).
        aggregation: Server combination: mean, or IGFL-S attention self, global, time (SPEC §4).
        attention_temperature: Temperature τ of the attention softmax (ψ/τ), > 0.
        compression: Sparsity q in (0, 1] of ternary compression with residuals (SPEC §7); None takes
            the preset's choice (off for all but ``efl``); False switches compression off.
        sampler: Client sampler: uniform, attention (AdaFL, SPEC §5).
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
    """

    def __init__(
        self,
        net: nn.Module | None = None,
        algorithm: str = "fedavg",
        objective: str | None = None,
        mu: float = 0.01,
        efl_lambda: float = 0.1,
        fisher_samples: int = 64,
        weighting: str | None = None,
        partial_work: str | None = None,
        aggregation: str | None = None,
        attention_temperature: float = 1.0,
        compression: float | bool | None = None,
        sampler: str | None = None,
        sampler_alpha: float = 0.9,
        fraction: float | FractionSchedule | None = None,
        p_inactive: float = 0.0,
        p_incomplete: float = 0.0,
        server_optimizer: Callable[[Iterable], torch.optim.Optimizer] | None = None,
        client_lr: float = 0.05,
        batch_size: int | None = 10,
        local_epochs: int = 1,
        local_steps: int | None = None,
        backend: str = "auto",
        chunk_size: int | None = None,
        loss: nn.Module | None = None,
        seed: int = 0,
        accuracy_targets: list[float] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net", "loss"])
        self.automatic_optimization = False
        cfg = algorithms.resolve(
            algorithm,
            objective=objective,
            weighting=weighting,
            partial_work=partial_work,
            aggregation=aggregation,
            compression=compression,
            sampler=sampler,
            fraction=fraction,
            server_optimizer=server_optimizer,
        )
        _check_positive("client_lr", client_lr)
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1 or None (full batch), got {batch_size}")
        if local_steps is None and local_epochs < 1:
            raise ValueError(f"local_epochs: must be >= 1, got {local_epochs}")
        if local_steps is not None and local_steps < 1:
            raise ValueError(f"local_steps: must be >= 1 or None, got {local_steps}")
        if backend not in BACKENDS:
            raise ValueError(f"backend: {backend!r} is not one of {BACKENDS}")
        if cfg["aggregation"] not in AGGREGATIONS:
            raise ValueError(f"aggregation: {cfg['aggregation']!r} is not one of {AGGREGATIONS}")
        if cfg["weighting"] not in WEIGHT_RULES:
            raise ValueError(f"weighting: {cfg['weighting']!r} is not one of {WEIGHT_RULES}")
        if cfg["partial_work"] not in PARTIAL_WORK:
            raise ValueError(f"partial_work: {cfg['partial_work']!r} is not one of {PARTIAL_WORK}")
        _check_positive("attention_temperature", attention_temperature)
        if cfg["compression"] is False:  # explicitly off, also for a preset that compresses (efl)
            cfg["compression"] = None
        if cfg["compression"] is not None:
            from lfed.server.compression import validate_sparsity

            validate_sparsity(cfg["compression"])
        if cfg["sampler"] not in SAMPLERS:
            raise ValueError(f"sampler: {cfg['sampler']!r} is not one of {tuple(SAMPLERS)}")
        if isinstance(sampler_alpha, bool) or not isinstance(sampler_alpha, (int, float)) or not 0.0 <= sampler_alpha < 1.0:
            raise ValueError(f"sampler_alpha: must be a number in [0, 1) (AdaFL's score decay α), got {sampler_alpha!r}")
        self.algorithm = algorithm
        self.objective = build_objective(cfg["objective"], mu=mu, efl_lambda=efl_lambda, fisher_samples=fisher_samples)
        self.weighting = cfg["weighting"]
        self.partial_work = cfg["partial_work"]
        self.aggregation = cfg["aggregation"]
        self.compression = cfg["compression"]
        self.sampler = AttentionSampler(sampler_alpha) if cfg["sampler"] == "attention" else SAMPLERS[cfg["sampler"]]()
        self.fraction = as_schedule(cfg["fraction"])
        self.stragglers = Stragglers(p_inactive, p_incomplete)
        self.server_optimizer = cfg["server_optimizer"]
        self.net = net
        self.loss = loss
        self.loss_fn = as_per_example_loss(loss)
        self.client_lr = float(client_lr)
        self.batch_size = batch_size
        self.local_epochs = local_epochs
        self.local_steps = local_steps
        self.backend = backend
        self.chunk_size = chunk_size
        self.seed = seed
        self.attention_temperature = float(attention_temperature)
        self.accuracy_targets = check_accuracy_targets(accuracy_targets)
        self.comm = CommunicationMeter()
        self.eval_history: list[tuple[int, float]] = []
        self.fed = None  # FederatedData on the device, set on fit start
        self.engine: CohortTrainer | None = None
        self.evaluation = GlobalEvaluation()
        self.bmta = BestMeanAccuracy()
        if net is not None:
            self._init_layout()

    # ------------------------------------------------------------------ setup
    def _init_layout(self) -> None:
        self.layout = ParamLayout.from_module(self.net)

    @property
    def needs_history(self) -> bool:
        """Whether previous client updates and the last global change are kept."""
        return self.objective.needs_history or self.aggregation == "time"

    def _datamodule(self):
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None or not hasattr(dm, "build"):
            raise ValueError("FederatedModule needs a FederatedDataModule: trainer.fit(module, datamodule=FederatedDataModule(...))")
        return dm

    def setup(self, stage: str) -> None:
        """Build the default net if none was given and allocate per-client state for N clients."""
        data = self._datamodule().build()
        if self.net is None:
            from lfed.models import MLP

            outputs = data.num_classes if data.num_classes is not None else math.prod(data.train_y.shape[1:])
            self.net = MLP(in_features=math.prod(data.train_x.shape[1:]), num_classes=outputs)
            self._init_layout()
        check_task(self.net, data, self.loss)  # the net's output against the classes / targets, before round 0
        N, P = data.num_clients, self.layout.num_params
        like = next(self.net.parameters()).detach()
        self.objective.setup(N, P, like)
        self.sampler.setup(data.client_sizes)
        if self.needs_history:
            self.register_buffer("previous_update", like.new_zeros(N, P))
            self.register_buffer("global_change", like.new_zeros(P))
        if self.compression is not None:
            self.register_buffer("client_residual", like.new_zeros(N, P))
            self.register_buffer("server_residual", like.new_zeros(P))
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
        if self.weighting == "dwfed":
            d.require_labels("weighting='dwfed' (label-count weights)")
        self._validate_composition(d.num_clients)
        backend = self.engine.resolve_backend(d.train_x, d.train_y)
        rank_zero_info(
            f"lfed: {self.algorithm} on {d.num_clients} clients, {self.layout.num_params:,} parameters, "
            f"backend={backend}, objective={self.objective.name}, weighting={self.weighting}, "
            f"aggregation={self.aggregation}, sampler={type(self.sampler).__name__}, fraction={self.fraction}, "
            f"server_optimizer={describe_optimizer(self.server_optimizer)}"
        )

    def _validate_composition(self, num_clients: int) -> None:
        """Warn about (or refuse) settings that make no sense together (algorithms.validate_composition)."""
        cfg = {
            "objective": self.objective.name, "weighting": self.weighting, "partial_work": self.partial_work,
            "aggregation": self.aggregation, "compression": self.compression, "fraction": self.fraction,
            "sampler": "attention" if isinstance(self.sampler, AttentionSampler) else "uniform",
        }
        explicit = {k for k in cfg if self.hparams.get(k) is not None}
        for message in algorithms.validate_composition(
            cfg, explicit, p_inactive=self.stragglers.p_inactive, p_incomplete=self.stragglers.p_incomplete,
            mu=getattr(self.objective, "mu", None), efl_lambda=getattr(self.objective, "lam", None),
            num_clients=num_clients, total_rounds=self._total_rounds(),
        ):
            rank_zero_warn(message, category=algorithms.CompositionWarning)

    # ------------------------------------------------------------------ one round
    def _total_rounds(self) -> int | None:
        ms = getattr(self.trainer, "max_steps", -1)
        return ms if ms and ms > 0 else None

    def step_budget(self, num_examples: Tensor) -> Tensor:
        """Planned local steps ``T_k``: ``local_steps``, or ``E * ceil(n_k / B)``."""
        if self.local_steps is not None:
            return torch.full_like(num_examples, self.local_steps)
        return self.local_epochs * steps_per_epoch(num_examples, self.batch_size)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """One federated round (SPEC §1)."""
        r = int(self.global_step)
        d = self._device_data()
        N = d.num_clients
        k = cohort_size(self.fraction(r, self._total_rounds()), N)
        clients, _ = self.sampler.sample(r, k, round_generator(self.seed, r, "sample"))
        clients = clients.to(self.device)
        n_k = d.client_sizes[clients]
        budget = self.step_budget(n_k)
        steps_done = self.stragglers.draw(budget.cpu(), round_generator(self.seed, r, "stragglers")).to(self.device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DegenerateWeightsWarning)
            weights = aggregation_weights(
                self.weighting,
                num_examples=n_k,
                steps_done=steps_done,
                step_budget=budget,
                partial_work=self.partial_work,
                client_label_counts=d.label_counts[clients],
                population_label_counts=d.label_counts.sum(0),
                dtype=torch.float64,
            )
        for w in caught:
            rank_zero_warn(f"round {r}: {w.message}")
        optimizer = self.optimizers()
        counting = counting_mask(steps_done, budget, self.partial_work)
        if not bool(counting.any()):
            rank_zero_warn(f"round {r}: no client's work counts (all inactive or dropped); the round is skipped")
            self.bmta.add_round(clients, None)
            optimizer.zero_grad(set_to_none=True)
            optimizer.step()  # no gradients: advances the round counter only
            self.log("round/skipped", 1.0)
            # the cohort was sampled and sent the model, but nobody's upload counts
            self.log_dict(self.comm.record(0, bits_down=clients.numel() * self._bits(dense=self.compression is None)))
            return

        w0 = self.layout.module_vector(self.net)
        cohort = Cohort(r, clients, n_k, budget, steps_done, N)
        if self.needs_history:
            cohort.previous_update = self.previous_update[clients]
            cohort.global_change = self.global_change
        rule = self.objective.step_rule(cohort, w0, self.client_lr)
        ranks = Ranks.of(self)
        with seeded_global_rng(self.seed, r, "dropout", self.device):  # a model's own randomness (dropout)
            result = train_cohort(  # the cohort split over the ranks (lfed.distributed)
                self.engine, ranks, w0, d.train_x, d.train_y, d.client_index[clients], n_k, steps_done, rule,
                self.client_lr, self.batch_size, round_generator(self.seed, r, "batches"),
            )
        self._check_finite(result.loss[:, None], r, clients, "training losses")
        updates = result.weights - w0
        self._check_finite(updates, r, clients, "client updates")

        def fisher(rows: Tensor) -> Tensor:
            return fisher_cohort(
                self.engine, ranks, result.weights[rows], d.train_x, d.train_y, d.client_index[clients][rows], n_k[rows],
                self.objective.fisher_samples, round_generator(self.seed, r, "fisher"),
            )

        with seeded_global_rng(self.seed, r, "fisher_dropout", self.device):
            self.objective.after_local(cohort, w0, result.weights, self.client_lr, fisher)

        sent = updates
        if self.compression is not None:
            sent = self._compress_upstream(updates, clients, counting)
        delta, extra = self._combine(sent, weights.to(sent.dtype), counting, cohort)
        if self.compression is not None:
            delta = self._compress_downstream(delta)
        self._check_finite(delta, r, clients, "the aggregated update")

        optimizer.zero_grad(set_to_none=True)
        for p, g in zip((p for p in self.net.parameters() if p.requires_grad), self.layout.unflatten(-delta).values()):
            p.grad = g.clone()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        w1 = self.layout.module_vector(self.net)
        self._check_finite(w1, r, clients, "the global model")

        if result.buffers is not None:
            self._aggregate_buffers(result.buffers, weights)
        active = cohort.active
        if self.needs_history:
            self.previous_update[clients[active]] = updates[active]
            self.global_change.copy_(w1 - w0)
        # AdaFL scores (SPEC §5) move only for clients whose model the server received and used:
        # an inactive or dropped client uploaded nothing, so it has no distance and keeps its score.
        self.sampler.update(clients[counting], (result.weights[counting] - w1).norm(dim=1))
        local = None  # bmta_local (SPEC §9): the counting participants' w_k_end on their own held-out splits
        if bool(counting.any()) and is_classification(d.train_y):
            local = local_accuracy(self.net, self.layout, result.weights[counting], d, clients[counting])
        local_mean = self.bmta.add_round(clients, local)
        if local_mean is not None:
            self.log("client/local_acc_mean", local_mean)
        self._log_round(r, clients, counting, result.loss, active, weights, extra)

    def _check_finite(self, x: Tensor, r: int, clients: Tensor, what: str) -> None:
        if bool(torch.isfinite(x).all()):
            return
        if x.dim() == 2:
            bad = clients[~torch.isfinite(x).all(dim=1)].tolist()
            detail = f"from clients {bad}"
        else:
            detail = f"(cohort {clients.tolist()})"
        raise FloatingPointError(
            f"round {r}: {what} contain NaN or Inf {detail}; stopping so no bad weights are saved. "
            "Lower client_lr, check the data of these clients, or resume from the last good checkpoint."
        )

    def _combine(self, sent: Tensor, weights: Tensor, counting: Tensor, cohort: Cohort) -> tuple[Tensor, dict]:
        """Server combination (SPEC §4): weighted mean or IGFL-S attention."""
        if self.aggregation == "mean":
            return weights @ sent, {}
        from lfed.server.attention import attention_combine

        res = attention_combine(
            sent, query=self.aggregation, previous_updates=cohort.previous_update,
            temperature=self.attention_temperature, mask=counting,
        )
        self.last_attention = res  # for lfed.callbacks.AttentionHeatmap
        self.last_attention_clients = cohort.clients
        self.last_attention_round = cohort.round
        return res.update, {"attention/entropy": float(res.entropy), "attention/weight_sum": float(res.weights.sum())}

    def _compress_upstream(self, updates: Tensor, clients: Tensor, counting: Tensor) -> Tensor:
        """Client-side ST with residuals for the clients whose upload counts (SPEC §7)."""
        from lfed.server.compression import compress_with_residual

        sent = torch.zeros_like(updates)
        ids = clients[counting]
        out, residual = compress_with_residual(updates[counting], self.client_residual[ids], self.layout.sizes, self.compression)
        sent[counting] = out
        self.client_residual[ids] = residual
        return sent

    def _compress_downstream(self, delta: Tensor) -> Tensor:
        """Server-side ST with residual: the model moves by the broadcast update (SPEC §7)."""
        from lfed.server.compression import compress_with_residual

        out, residual = compress_with_residual(delta, self.server_residual, self.layout.sizes, self.compression)
        self.server_residual.copy_(residual)
        return out

    def _aggregate_buffers(self, buffers: dict[str, Tensor], weights: Tensor) -> None:
        """Average floating buffers (BatchNorm running stats) with the normalised weights."""
        own = dict(self.net.named_buffers())
        a = weights / weights.sum()
        for name, stacked in buffers.items():
            if stacked.is_floating_point():
                own[name].copy_(torch.einsum("k,k...->...", a.to(stacked.dtype), stacked))
            else:
                own[name].copy_(stacked.max(0).values)

    def _bits(self, dense: bool) -> int:
        from lfed.server import compression as c

        if dense or self.compression is None:
            return c.dense_bits(self.layout.sizes)
        return c.ternary_bits(self.layout.sizes, self.compression)

    def _log_round(self, r, clients, counting, losses, active, weights, extra) -> None:
        uploads = int(counting.sum())
        per_client = self._bits(dense=self.compression is None)
        metrics = self.comm.record(uploads, bits_up=uploads * per_client, bits_down=clients.numel() * per_client)
        if bool(active.any()):
            self.log("train/loss", losses[active].mean(), prog_bar=True)
        self.log("round/clients", float(clients.numel()))
        self.log("round/active", float(active.sum()))
        self.log("round/weight_sum", float(weights.sum()))
        self.log_dict(metrics)
        if extra:
            self.log_dict(extra)

    # ------------------------------------------------------------------ evaluation (SPEC §9, lfed.evaluation)
    def on_validation_epoch_start(self) -> None:
        self.evaluation.reset()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.evaluation.update(self.net, self.loss_fn, *batch)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

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
        if stage == "val" and not self.trainer.sanity_checking and acc is not None:
            self.eval_history.append((int(self.global_step), acc))
            self.comm.log_accuracy(acc)
            if per_client is not None:
                self.bmta.add_evaluation(per_client)

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
    def last_rounds_accuracy(self, share: float = 0.1) -> float | None:
        """Mean test accuracy over the evaluations in the last ``share`` of rounds (IGFL's figure)."""
        if not self.eval_history:
            return None
        last = self.eval_history[-1][0]
        cutoff = last - max(1, math.ceil(share * last))
        accs = [a for r, a in self.eval_history if r > cutoff]
        return sum(accs) / len(accs)

    def on_train_end(self) -> None:
        summary: dict[str, float] = {}
        last = self.last_rounds_accuracy()
        if last is not None:
            summary["final/test_acc_last10pct"] = last
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
        from lfed.checkpoint import module_fingerprint

        checkpoint["lfed"] = {
            "comm": self.comm.state_dict(),
            "eval_history": list(self.eval_history),
            "bmta": self.bmta.state_dict(),
            "fingerprint": module_fingerprint(self),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of another run (lfed.checkpoint.verify_fingerprint), then restore."""
        from lfed.checkpoint import module_fingerprint, verify_fingerprint

        state = checkpoint.get("lfed")
        verify_fingerprint((state or {}).get("fingerprint"), module_fingerprint(self))
        if state:
            self.comm.load_state_dict(state["comm"])
            self.eval_history = [tuple(x) for x in state["eval_history"]]
            if "bmta" in state:
                self.bmta.load_state_dict(state["bmta"])

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # Per-client history and residuals ([N, P]) made for other clients or another model fail clearly.
        check_state_shapes(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
