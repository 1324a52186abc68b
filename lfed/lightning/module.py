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
from pathlib import Path
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

    def setup(self, stage: str) -> None:
        """Set the runs up on the Trainer's data (:meth:`FederatedDriver.setup`); a module loaded in Python
        (:meth:`load_from_checkpoint`) gets its checkpoint's state back over the fresh allocation, so a ``Trainer``
        scores (or, once, trains on from) the run the checkpoint holds."""
        super().setup(stage)
        loaded = self.__dict__.get("_loaded")
        if loaded is not None:
            self.load_state_dict(loaded["state_dict"])
            self.on_load_checkpoint(loaded)
            if stage == "fit":  # from here on the state is the training's own
                del self.__dict__["_loaded"]

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | Path, map_location: Any = None, hparams_file: Any = None,
                             strict: bool | None = None, datamodule: Any = None, **settings: Any) -> FederatedModule:
        """The run a checkpoint holds, in Python: built from the settings ``lfed fit`` recorded in it (the net and
        every component as configured, ``lfed_config``), set up on its own data (``module.datamodule``, a
        :class:`~lfed.lightning.datamodule.FederatedDataModule`) and restored: ``module.net`` is the trained model,
        every component's state is the checkpoint's. ``Trainer().test(module, datamodule=module.datamodule)`` scores
        it as ``lfed test --ckpt_path`` does.

        ``settings``: model settings that replace the recorded ones (a checkpoint written by a ``Trainer`` in Python
        records no net: give ``net=``); ``datamodule``: the data to set up on (needed when the checkpoint records
        none); ``map_location``: a device to move the module to; ``strict``: as ``load_state_dict``'s.
        """
        import torch

        from lfed.lightning.checkpoint import read_checkpoint
        from lfed.lightning.run_dirs import CONFIG_KEY

        if hparams_file is not None:
            raise ValueError("hparams_file: not used: an lfed checkpoint records its run's own settings (give model "
                             "settings as keywords to replace them)")
        ckpt = read_checkpoint(checkpoint_path)
        recorded = ckpt.get(CONFIG_KEY) or {}
        model = recorded.get("model") or ckpt.get("hyper_parameters") or {}
        model = {k: v for k, v in model.items() if k not in settings}
        given, data = _instantiated(cls, model, recorded.get("data") if datamodule is None else None)
        if datamodule is None and data is None:
            raise ValueError(f"datamodule: {checkpoint_path} records no data settings (it was not written by `lfed fit`); "
                             "give the data it was trained on: load_from_checkpoint(path, datamodule=FederatedDataModule(...))")
        module = cls(**{**given, **settings})
        run = module.runs[0]
        run.datamodule = datamodule if datamodule is not None else data
        nets = [v for k, v in ckpt["state_dict"].items() if k.startswith("net.") and v.is_floating_point()]
        dtype = nets[0].dtype if nets else None  # the precision it trained in (64-true: float64)
        run.setup(run.datamodule.build(), None, (lambda net: net.to(dtype)) if dtype is not None else None)
        module.load_state_dict(ckpt["state_dict"], strict=True if strict is None else strict)
        module.on_load_checkpoint(ckpt)
        module._loaded = {"state_dict": ckpt["state_dict"], "lfed": ckpt["lfed"]}  # for a Trainer's setup (:meth:`setup`)
        if map_location is not None:
            module.to(torch.device(map_location))
        return module.eval()


def _instantiated(cls: type, model: dict[str, Any], data: dict[str, Any] | None) -> tuple[dict[str, Any], Any]:
    """Recorded ``model`` settings as the module's keyword arguments (``class_path`` choices built, as the command
    line builds them) and recorded ``data`` settings as their FederatedDataModule (None: none recorded)."""
    from jsonargparse import ArgumentParser, Namespace

    from lfed.lightning.datamodule import FederatedDataModule

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "model")
    if data is not None:
        parser.add_class_arguments(FederatedDataModule, "data")
    recorded = {"model": model, **({"data": data} if data is not None else {})}
    init = parser.instantiate_classes(parser.parse_object(recorded), instantiate_groups=False)
    plain = lambda v: v.as_dict() if isinstance(v, Namespace) else v  # noqa: E731 - a group parsed as a namespace
    given = {k: plain(v) for k, v in vars(init.model).items()}
    return given, FederatedDataModule(**{k: plain(v) for k, v in vars(init.data).items()}) if data is not None else None
