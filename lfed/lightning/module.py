"""FederatedModule: one federated run under Lightning, one round per training step (docs/algorithms.md §1).

It is the one driver (:class:`lfed.lightning.driver.FederatedDriver`) of one run
(:class:`lfed.core.run.FederatedRun`, built by :func:`lfed.core.settings.build_run` from the ``model:`` section of a config):
``automatic_optimization`` is off; each ``training_step`` runs the round (sample a cohort,
train it on the device with :class:`~lfed.engine.CohortTrainer`, combine the updates, step the
server optimizer once), so ``global_step == round`` and Lightning's ``max_steps``,
``val_check_interval``, checkpointing, loggers and progress bar all count rounds. The module
reads as its run: ``module.net`` is the global model, ``module.objective`` ... the components,
whose declared state (:mod:`lfed.state.spec`) is in the state dict, so a checkpoint resumes a run exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any

import torch
from torch import nn

from lfed.base.attack import Attack
from lfed.client.objectives import ClientRule
from lfed.core import registry as algorithms
from lfed.core.algorithm import LocalTraining
from lfed.core.asynchronous import Asynchronous
from lfed.core.settings import Engine, Evaluation, RunSettings
from lfed.lightning.driver import FederatedDriver
from lfed.participation.sampling import ClientSampler, FractionSchedule
from lfed.participation.stragglers import Stragglers
from lfed.server.channel import Channel
from lfed.server.combination import ServerCombination
from lfed.server.weighting import AggregationWeights, PartialWork

#: The settings' defaults (the groups' come from here: one instance each, shared as the signature's defaults).
_DEFAULT = RunSettings()

class FederatedModule(FederatedDriver):
    """Federated training of one global model over simulated clients.

    The arguments are a run's settings, the fields of :class:`lfed.core.settings.RunSettings` (a test holds this
    signature to them: names, types, defaults); ``RunSettings(...).build()`` or :func:`lfed.core.settings.build_run`
    builds the same run without Lightning. Every role left ``None`` comes from the preset ``algorithm``
    (:mod:`lfed.core.registry`); set any of them to compose your own algorithm, by name or as a component with
    its own settings (``class_path``; see ``docs/extending.md``). lfed 0.3's flat keys (``client_lr``,
    ``mu``, ``aggregation``, ...) are refused (0.5) with one line naming each new key.

    Args:
        net: The global model (any ``nn.Module``). None builds lfed's MLP 2NN sized from the data.
        algorithm: A preset (:data:`lfed.core.registry.PRESETS`).
        objective: Client rule (docs/algorithms.md §2): a name or a ``ClientRule`` with its settings.
        weighting: Aggregation weights (docs/algorithms.md §3): a name or an ``AggregationWeights``.
        partial_work: What stragglers' partial work counts for: keep, drop, scale (EFL T/s).
        combination: Server combination (docs/algorithms.md §4): a name or a ``ServerCombination``.
        channel: Upload channel (docs/algorithms.md §7): ternary sparsity q in (0, 1], False (dense), or a ``Channel``.
        sampler: Client sampler (docs/algorithms.md §5): uniform, attention (AdaFL), poisson (DP), or a ``ClientSampler``.
        fraction: Participation fraction C in (0, 1], or a schedule (lfed.participation.sampling).
        server_optimizer: Optimizer on the pseudo-gradient -Δ (``torch.optim.SGD``, lr=1: FedAvg).
        training: How clients train.
        stragglers: Clients that do less than planned (docs/algorithms.md §6).
        engine: How the cohort is computed and where client state lives.
        evaluation: What an evaluation scores besides the global model.
        loss: Client loss (a torch.nn loss; cross-entropy by default).
        seed: Seed of sampling, stragglers, batches and Fisher draws (per round).
        asynchronous: FedBuff / FedAsync on a simulated clock (docs/async.md). None: synchronous.
        attack: Byzantine clients and what they send (docs/robustness.md): a name or an ``Attack`` with its
            ``fraction`` (or ``per_round``). None: no attack.
    """

    def __init__(
        self,
        net: nn.Module | None = None,
        algorithm: algorithms.AlgorithmName = "fedavg",
        objective: algorithms.ObjectiveName | ClientRule | None = None,
        weighting: algorithms.WeightingName | AggregationWeights | None = None,
        partial_work: PartialWork | None = None,
        combination: algorithms.CombinationName | ServerCombination | None = None,
        channel: float | bool | algorithms.ChannelName | Channel | None = None,
        sampler: algorithms.SamplerName | ClientSampler | None = None,
        fraction: float | FractionSchedule | None = None,
        server_optimizer: Callable[[Iterable], torch.optim.Optimizer] | None = None,
        training: LocalTraining = _DEFAULT.training,
        stragglers: Stragglers = _DEFAULT.stragglers,
        engine: Engine = _DEFAULT.engine,
        evaluation: Evaluation = _DEFAULT.evaluation,
        loss: nn.Module | None = None,
        seed: int = 0,
        asynchronous: Asynchronous | None = None,
        attack: algorithms.AttackName | Attack | None = None,
        **deprecated: Any,
    ) -> None:
        given = locals()  # the arguments, read by the settings' own names (RunSettings: the one list of them)
        s = RunSettings.of(**{f.name: given[f.name] for f in fields(RunSettings)}, **deprecated)
        super().__init__([s.build()])
        self.save_hyperparameters(s.hparams())  # the settings in their one form, plain values (weights_only checkpoints)
