"""FederatedModule: one federated run under Lightning, one round per training step (SPEC §1).

It is the one driver (:class:`lfed.driver.FederatedDriver`) of one run
(:class:`lfed.run.FederatedRun`), built from flat settings (the ``model:`` section of a config):
``automatic_optimization`` is off; each ``training_step`` runs the round (sample a cohort,
train it on the device with :class:`~lfed.engine.CohortTrainer`, combine the updates, step the
server optimizer once), so ``global_step == round`` and Lightning's ``max_steps``,
``val_check_interval``, checkpointing, loggers and progress bar all count rounds. The module
reads as its run: ``module.net`` is the global model, ``module.objective`` ... the components,
whose declared state (:mod:`lfed.state`) is in the state dict, so a checkpoint resumes a run exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import torch
from torch import nn

from lfed import algorithms
from lfed.asynchronous import Asynchronous
from lfed.client.objectives import ClientRule
from lfed.client_state import PLACEMENTS, ClientStateStore
from lfed.driver import FederatedDriver
from lfed.engine import BACKENDS
from lfed.round import LocalTraining
from lfed.run import FederatedRun
from lfed.sampling import ClientSampler, FractionSchedule
from lfed.server.channel import Channel
from lfed.server.combination import ServerCombination
from lfed.server.weighting import AggregationWeights
from lfed.validation import integer, number, one_of


class FederatedModule(FederatedDriver):
    """Federated training of one global model over simulated clients.

    Every argument left ``None`` comes from the preset ``algorithm`` (see
    :mod:`lfed.algorithms`); set any of them to compose your own algorithm, by name or as a
    component (``class_path``; see ``docs/extending.md``).

    Args:
        net: The global model (any ``nn.Module``). None builds lfed's MLP 2NN sized from the data.
        algorithm: A preset (:data:`lfed.algorithms.PRESETS`; every name in the type's choices).
        objective: Client rule (SPEC §2): a name or a ``ClientRule``.
        mu: FedProx proximal coefficient.
        efl_lambda: EFL elastic coefficient λ.
        fisher_samples: EFL examples per client for the Fisher diagonal.
        weighting: Aggregation weights (SPEC §3): a name or an ``AggregationWeights``.
        partial_work: What stragglers' partial work counts for: keep, drop, scale (EFL T/s).
        aggregation: Server combination (SPEC §4): mean, or IGFL-S attention with query self,
            global or time; or a ``ServerCombination``.
        attention_temperature: Temperature τ of the attention softmax (ψ/τ), > 0.
        time_weights: Time attention's weights (SPEC §4): softmax (default) or diagonal (literal).
        compression: Ternary sparsity q in (0, 1] (SPEC §7) or a ``Channel``; None: the preset's; False: dense.
        sampler: Client sampler (SPEC §5): uniform, attention (AdaFL), poisson (DP), or a ``ClientSampler``.
        sampler_alpha: AdaFL score decay α in [0, 1).
        fraction: Participation fraction C in (0, 1], or a schedule (lfed.sampling).
        p_inactive: Probability that a sampled client does no work (SPEC §6).
        p_incomplete: Probability that a sampled client stops early.
        server_optimizer: Optimizer on the pseudo-gradient -Δ (``torch.optim.SGD``, lr=1: FedAvg).
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
        personal_clients: Clients scored on their own held-out splits at every evaluation (``global/*``,
            ``personal/*``; docs/personalization.md): None, all; a number, a seeded sample of that many.
        personal_chunk: Clients whose personal models are scored per vmapped call (bounds memory).
        round_local_accuracy: Score the trained models on their held-out splits each round (``bmta_local``).
        asynchronous: FedBuff / FedAsync on a simulated clock (docs/async.md). None: synchronous.
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
        sampler: Literal["uniform", "attention", "poisson"] | ClientSampler | None = None,
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
        personal_clients: int | None = None,
        personal_chunk: int = 256,
        round_local_accuracy: bool = True,
        asynchronous: Asynchronous | None = None,
    ) -> None:
        given = dict(objective=objective, weighting=weighting, partial_work=partial_work, aggregation=aggregation,
                     compression=compression, sampler=sampler, fraction=fraction, server_optimizer=server_optimizer)
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
        components = algorithms.build(
            cfg, mu=mu, efl_lambda=efl_lambda, fisher_samples=fisher_samples, attention_temperature=attention_temperature,
            time_weights=time_weights, sampler_alpha=sampler_alpha, p_inactive=p_inactive, p_incomplete=p_incomplete,
        )
        components.asynchronous = asynchronous
        run = FederatedRun(
            components, LocalTraining(float(client_lr), batch_size, local_epochs, local_steps), cfg["server_optimizer"],
            net=net, loss=loss, backend=backend, chunk_size=chunk_size, seed=seed, accuracy_targets=accuracy_targets,
            store=ClientStateStore(client_state, client_state_dir), algorithm=algorithm,
            explicit=frozenset(k for k, v in given.items() if v is not None),
            personal_clients=personal_clients, personal_chunk=personal_chunk,
            round_local_accuracy=round_local_accuracy,
        )
        super().__init__([run])
        objects = [k for k, v in given.items() if isinstance(v, nn.Module)]  # rebuilt from the config, not pickled
        if asynchronous is not None:
            objects.append("asynchronous")
        self.save_hyperparameters(ignore=["net", "loss", *objects])
