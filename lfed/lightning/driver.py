"""The one Lightning driver: one training step is one lock-step round of every run (docs/algorithms.md §1).

:class:`FederatedDriver` trains :class:`~lfed.core.run.FederatedRun` objects under Lightning's ``Trainer``: a single
run (:class:`lfed.lightning.module.FederatedModule`) is a driver of one run, a grid (:class:`lfed.lightning.group.RunGroup`, ``lfed
grid``) a driver of many. Each ``training_step`` is :func:`lfed.core.step.train_step` (every running run's round
prepared, all their cohorts trained in as few engine calls as is exact, split over the ranks under DDP, each
run's round finished with its own rows) and its logging; the server optimizers are stepped inside the round and
Lightning's one optimizer (:class:`RunOptimizers`) counts the round, so ``global_step == round`` and
``max_steps``, ``val_check_interval``, checkpoints, callbacks, loggers and the progress bar all count rounds.
Evaluation runs in the validation (test) loop, whose loader yields one item per evaluation
(:class:`lfed.lightning.datamodule.FederatedDataModule`). A run of a grid logs its metrics as ``<name>/<metric>``,
which :class:`lfed.lightning.member_logs.MemberLoggers` routes to that run's own logs.

Divergence (NaN or Inf) stops a run: alone, the error ends the fit; in a grid the run stops and
the others go on (``run/diverged``), and the fit stops when none is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from lfed.core.registry import CompositionWarning
from lfed.core.run import FederatedRun
from lfed.core.step import train_step
from lfed.engine.precision import release_loss_scaler, round_precision
from lfed.engine.ranks import Ranks
from lfed.lightning.ddp import logged_as_reduced, prepare_strategy
from lfed.lightning.rounds import check_trainer_schedule, request_final_evaluation
from lfed.state.environment import EnvironmentWarning, environment, environment_note
from lfed.state.fingerprint import run_fingerprint, verify_fingerprint

__all__ = ["FederatedDriver", "RunOptimizers"]


def _host_scalar(value: float) -> torch.Tensor:
    """A round's metric (read to the host once, :func:`lfed.engine.host.read_metrics`) as Lightning logs a float, but on the
    CPU: ``self.log`` of a float makes a tensor on the module's device (a copy that waits for the device on CUDA) and
    reads it back to log it; Lightning keeps a CPU tensor's metric on the CPU."""
    return torch.tensor(value, dtype=torch.get_default_dtype())


class RunOptimizers(torch.optim.Optimizer):
    """The runs' server optimizers as the one optimizer Lightning sees.

    Each run steps its own optimizer inside its round (:meth:`lfed.core.run.FederatedRun.server_step`);
    this optimizer's ``step`` does nothing and is called once per round, so Lightning counts
    rounds. Its state dict holds every run's optimizer state (exact resume).
    """

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.optimizers = list(optimizers)
        super().__init__([p for o in self.optimizers for g in o.param_groups for p in g["params"]], {})

    def step(self, closure: Any = None) -> Any:
        """The round's tick: Lightning's closure runs (its ``on_before_optimizer_step`` hooks), nothing is stepped."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"runs": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict["runs"]
        if len(states) != len(self.optimizers):
            raise ValueError(f"checkpoint: it holds the server optimizers of {len(states)} runs, this job has "
                             f"{len(self.optimizers)}")
        for o, s in zip(self.optimizers, states):
            o.load_state_dict(s)


class FederatedDriver(LightningModule):
    """Federated training of one run or of many in lock-step (module docstring).

    A driver of one run reads as that run: ``module.net``, ``module.comm``, ``module.eval_history``
    ... are the run's.

    Args:
        runs: The runs (names unique; '' for a run alone).
        datamodules: Each run's :class:`~lfed.lightning.datamodule.FederatedDataModule`; None: the trainer's.
    """

    def __init__(self, runs: Sequence[FederatedRun], datamodules: Sequence[Any] | None = None) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.runs = nn.ModuleList(runs)
        self.member_datamodules = list(datamodules) if datamodules is not None else None
        self.engine_calls = 0

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            runs = self.__dict__.get("_modules", {}).get("runs")
            if runs is not None and len(runs) == 1 and not name.startswith("__"):
                return getattr(runs[0], name)
            raise

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A group's state: ``runs.<i>.net.*``, ...; one run's reads as the run's (``net.*``, ``objective.*``)."""
        return self.runs[0].state_dict(*args, **kwargs) if len(self.runs) == 1 else super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        target = self.runs[0] if len(self.runs) == 1 else super()
        return target.load_state_dict(state_dict, strict=strict, assign=assign)

    @property
    def fed(self) -> Any:
        """lfed 0.2's ``pl_module.fed`` (the federated data on the device): now ``pl_module.data`` (one run), or
        ``run.data`` of each of ``pl_module.runs``. Warns (a ``FutureWarning``, shown by default) and returns it for one
        run; a grid raises (its runs may hold different data)."""
        import warnings

        message = ("pl_module.fed (lfed 0.2) is gone: the federated data on the device is pl_module.data (one run), "
                   "or run.data for run in pl_module.runs")
        if len(self.runs) != 1:
            raise RuntimeError(message)  # not AttributeError: nn.Module's __getattr__ would hide the message
        warnings.warn(message, FutureWarning, stacklevel=2)
        return self.runs[0].data

    @property
    def server_optimizers(self) -> list[torch.optim.Optimizer]:
        """Each run's server optimizer, in the runs' order (once the Trainer has made them)."""
        return list(self.trainer.optimizers[0].optimizers)

    @property
    def grouped(self) -> bool:
        """Whether the driver trains several runs (their metrics are logged as ``<name>/<metric>``)."""
        return len(self.runs) > 1

    def _prefix(self, run: FederatedRun) -> str:
        return f"{run.name}/" if self.grouped else ""

    # ------------------------------------------------------------------ set-up
    def _datamodules(self) -> list[Any]:
        if self.member_datamodules is not None:
            return self.member_datamodules
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None or not hasattr(dm, "build"):
            raise ValueError("FederatedModule needs a FederatedDataModule: trainer.fit(module, datamodule=FederatedDataModule(...))")
        return [dm]

    def setup(self, stage: str) -> None:
        """Build every run's data (one load of a dataset they share), default net and state."""
        from lfed.lightning.datamodule import share_datasets

        datamodules = self._datamodules()
        share_datasets(datamodules)
        for run, dm in zip(self.runs, datamodules):
            run.datamodule = dm
            run.setup(dm.build(), self.trainer.default_root_dir, self.trainer.precision_plugin.convert_module)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return RunOptimizers([run.server_optimizer([p for p in run.net.parameters() if p.requires_grad])
                              for run in self.runs])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.runs[0].net(x)

    def _device_data(self) -> None:
        """Every run's data on the module's device and dtype (tensors they share converted once)."""
        if all(run.data is not None and run.data.train_x.device == self.device for run in self.runs):
            return
        converted: dict[int, torch.Tensor] = {}
        for run in self.runs:
            dtype = next(run.net.parameters()).dtype
            run.data = run.datamodule.build().to(self.device, dtype, converted)

    def on_fit_start(self) -> None:
        from lfed.lightning.reporting import describe_optimizer

        prepare_strategy(self.trainer)
        check_trainer_schedule(self.trainer)
        scaler_message = release_loss_scaler(self.trainer)  # 16-mixed on a GPU (lfed.engine.precision)
        if scaler_message:
            rank_zero_warn("lfed: " + scaler_message)
        self._device_data()
        notices: dict[str, list[str]] = {}
        for run in self.runs:
            for message in run.start(run.data, self._total_rounds()):  # settings that make no sense together
                rank_zero_warn(self._prefix(run) + message, category=CompositionWarning)
            for line in run.notices():  # DP: where the noise comes from; splits that are client data
                notices.setdefault(line, []).append(self._prefix(run))
        for line, prefixes in notices.items():  # a line that every run of a group shares, once
            if len(self.runs) > 1 and len(prefixes) == len(self.runs):
                rank_zero_info(f"lfed: every run: {line}")
            else:
                for prefix in prefixes:
                    rank_zero_info(f"lfed: {prefix}{line}")
        run, d = self.runs[0], self.runs[0].data
        backend = run.engine.resolve_backend(d.train_x, d.train_y)
        labels = ", ".join(dict.fromkeys(r.label for r in self.runs))  # a grid's: each composition it runs, once
        what = f"{len(self.runs)} runs of {labels}" if self.grouped else run.label
        said: dict[str, list[str]] = {}  # each setting's values over the runs ("objective=plain|prox|scaffold")
        for r in self.runs:
            for k, v in {**r.composition, "server_optimizer": describe_optimizer(r.server_optimizer)}.items():
                if k not in getattr(r.schedule, "unused", ()):
                    said.setdefault(k, []).append(str(v))
        rank_zero_info(
            f"lfed: {what} on {d.num_clients} clients, {run.layout.num_params:,} parameters, backend={backend}, "
            + ", ".join(f"{k}={'|'.join(dict.fromkeys(v))}" for k, v in said.items())
        )

    # ------------------------------------------------------------------ one round of every run
    def _total_rounds(self) -> int | None:
        ms = getattr(self.trainer, "max_steps", -1)
        return ms if ms and ms > 0 else None

    @round_precision()  # mixed precision: autocast in the local steps only, the rest of the round in float32
    def training_step(self, batch: Any, batch_idx: int) -> None:
        """One federated round (docs/algorithms.md §1) of every running run, their cohorts trained together
        (:func:`lfed.core.step.train_step`); what is the driver's: logging, stopping the fit."""
        r, total = int(self.global_step), self._total_rounds()
        self._device_data()
        tick = self.optimizers()
        outcomes, calls = train_step(self.runs, tick.optimizer.optimizers, r, total, Ranks.of(self))
        self.engine_calls += calls
        for outcome in outcomes:
            run, p = outcome.run, self._prefix(outcome.run)
            if outcome.error is not None:
                self._stop(run, outcome.error)
                continue
            for message in outcome.messages:
                rank_zero_warn(p + message)
            metrics = dict(outcome.metrics)
            loss = metrics.pop("train/loss", None)
            if loss is not None:
                self.log(p + "train/loss", _host_scalar(loss), prog_bar=not self.grouped)
            self.log_dict({p + k: _host_scalar(v) for k, v in metrics.items()})
        tick.step()  # counts the round: global_step == rounds done
        for outcome in outcomes:  # a component forbade the next round (DP's budget): the run stopped here
            if outcome.stopped:
                rank_zero_info(f"lfed: {self._prefix(outcome.run)}{outcome.stopped}")
        if any(run.status == "stopped" for run in self.runs) and not any(run.running for run in self.runs):
            self.trainer.should_stop = True  # Lightning evaluates once more; on_train_end writes the checkpoint

    def _stop(self, run: FederatedRun, error: FloatingPointError) -> None:
        """A run diverged: alone, the error ends the fit; in a grid the run stops and the others go on."""
        if not self.grouped:
            raise error
        rank_zero_warn(f"lfed: {run.name} stopped at round {int(self.global_step)}: {error}")
        for key, value in run.diverged(error).items():  # gated (lfed.base.metric_gate)
            self.log(self._prefix(run) + key, value)
        if not any(r.running for r in self.runs):
            self.trainer.should_stop = True

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        request_final_evaluation(self.trainer)  # the last round is always evaluated

    # ------------------------------------------------------------------ evaluation (docs/algorithms.md §9)
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(record=not self.trainer.sanity_checking)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(record=False)

    def _evaluate(self, record: bool) -> None:
        self._device_data()
        ranks = Ranks.of(self)
        strategy = self.trainer.strategy
        reduce = (lambda t: strategy.reduce(t, reduce_op="sum")) if ranks.distributed else (lambda t: t)
        for run in self.runs:
            if run.status == "diverged":
                continue
            metrics, per_client = run.evaluate(ranks, reduce, int(getattr(run.datamodule, "eval_batch_size", 2048)))
            if record:
                run.record_evaluation(int(self.global_step), metrics, per_client)
            p = self._prefix(run)
            released = {p + key: value for key, value in run.metric_gate(metrics).items()}  # under DP: what it may release
            if ranks.distributed:  # the same numbers on every rank: logged as they are, not averaged over the ranks
                logged_as_reduced(released)
            for name, value in released.items():  # (lfed.lightning.ddp.logged_as_reduced says why sync_dist is off)
                self.log(name, value, prog_bar=name == "test/acc" and not self.grouped, sync_dist=False)

    def client_accuracy(self) -> torch.Tensor | None:
        """Accuracy of the (first) run's global model on each client's held-out split (clients with one)."""
        self._device_data()
        per_client = self.runs[0].client_accuracy()
        return None if per_client is None else per_client[~torch.isnan(per_client)]

    # ------------------------------------------------------------------ end of run, checkpoints
    def on_train_end(self) -> None:
        if self.runs and not any(run.running for run in self.runs) and any(run.status == "stopped" for run in self.runs):
            for callback in self.trainer.checkpoint_callbacks:  # stopped before max_steps: a checkpoint of where it stopped
                if hasattr(callback, "save_now"):
                    callback.save_now(self.trainer)
        self._save_histograms()
        for run in self.runs:
            summary = run.summary() if run.status != "diverged" else {}
            if summary:
                for logger in self.loggers:
                    # on the last round's row (step = rounds - 1, as its evaluation): no row of a round that never ran
                    logger.log_metrics({self._prefix(run) + k: v for k, v in summary.items()},
                                       step=max(int(self.global_step) - 1, 0))
            if not self.grouped:
                rank_zero_info("lfed: " + ", ".join(f"{k}={v:.4g}" for k, v in summary.items()))

    def _save_histograms(self) -> None:
        """docs/algorithms.md §13: each run's histogram of per-client accuracy at its last evaluation, ``personal_accuracy.png`` in the
        run directory (a grid: in each run's own directory), logged to W&B as ``personal/acc_histogram``. Rank 0
        only, and nothing without a logger. No collective (a grid's loggers live on rank 0 alone)."""
        from pathlib import Path

        from lightning.pytorch.loggers import WandbLogger

        from lfed.lightning.member_logs import MemberLoggers

        if self.trainer.global_rank != 0 or not self.trainer.loggers:
            return
        from lfed.lightning.reporting import MetricsCSV

        first = self.trainer.loggers[0]
        ours = next((lg for lg in self.trainer.loggers if isinstance(lg, MetricsCSV)), None)
        # beside lfed's metrics.csv (the run directory), not in the first logger's folder (a CSVLogger's version_<n>)
        base = Path(ours.save_dir if ours is not None else
                    getattr(first, "log_dir", None) or first.save_dir or self.trainer.default_root_dir)
        for run in self.runs:
            path = run.accuracy_histogram(base / run.name / "personal_accuracy.png" if run.name
                                          else base / "personal_accuracy.png")
            if path is None:
                continue
            loggers = []
            for logger in self.loggers:
                loggers += logger.members.get(run.name, []) if isinstance(logger, MemberLoggers) else [logger]
            for logger in loggers:
                if isinstance(logger, WandbLogger):
                    logger.log_image(key=run.metric_gate.name("personal/acc_histogram"), images=[str(path)])

    def on_fit_end(self) -> None:
        """A run that trained every round is ``done`` (also when a resume found nothing left to train). Under DP, one
        line says where the checkpoints are and that they hold client data (:mod:`lfed.privacy.contents`)."""
        total = self._total_rounds()
        for run in self.runs:
            if run.status == "running" and total is not None and run.rounds_done >= total:
                run.status = "done"
                if not run.final_summary:
                    run.summary()
        callback = getattr(self.trainer, "checkpoint_callback", None)
        where = getattr(callback, "dirpath", None)
        if where and any(run.metric_gate.active for run in self.runs):
            rank_zero_info(f"lfed: the checkpoints in {where} hold client data no accountant covers (per-round upload counts, "
                           "the last cohort's ids, the clients' sizes and label hash, accuracies on their own splits, "
                           "every per-client state row), listed in each file's lfed.client_data: keep them as private as "
                           "the clients' data (docs/privacy.md, 'What a checkpoint holds')")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        total = self._total_rounds()
        checkpoint["lfed"] = {"runs": [{**run.extra_state(), "fingerprint": run_fingerprint(run, total, run.datamodule)}
                                       for run in self.runs],
                              "environment": environment(self._root_device())}  # what its bits depend on
        if any(run.metric_gate.active for run in self.runs):  # DP: mark what it holds of the clients' data, unnoised
            from lfed.privacy.contents import client_data

            checkpoint["lfed"]["client_data"] = client_data(checkpoint, self._per_client_state())

    def _per_client_state(self) -> list[str]:
        """Every run's per-client state tensors as ``<role>.<name>`` (:func:`lfed.privacy.contents.classify`)."""
        return sorted({f"{role}.{spec.name}" for run in self.runs for role, c in run.components.roles().items()
                       for spec in c.state_specs() if spec.per_client})

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of another run (lfed.state.fingerprint.verify_fingerprint), then restore."""
        states = (checkpoint.get("lfed") or {}).get("runs")
        if states is None or len(states) != len(self.runs):
            found = "no lfed run" if states is None else f"{len(states)} runs"
            raise ValueError(f"checkpoint: it holds {found}, this job has {len(self.runs)}; resume it with the "
                             "configuration (and sweep) it was written by")
        total = self._total_rounds() if self._trainer is not None else None
        for run, state in zip(self.runs, states):
            verify_fingerprint(state.get("fingerprint"), run_fingerprint(run, total, run.datamodule, state.get("fingerprint")))
            run.load_extra_state(state)
        if self._trainer is not None and self.trainer.state.fn == "fit":  # a resume: what its bits depend on, if changed
            note = environment_note(checkpoint["lfed"].get("environment"), environment(self._root_device()),
                                    str(getattr(self.trainer, "ckpt_path", None) or "the checkpoint"))
            if note is not None:  # one line, rank 0: the continuation is exact in its maths, not in its bits
                rank_zero_warn(note, category=EnvironmentWarning)

    def _root_device(self) -> torch.device:
        """The device the run trains on (the strategy's; the module may not be on it yet while a checkpoint loads)."""
        strategy = getattr(self._trainer, "strategy", None) if self._trainer is not None else None
        return getattr(strategy, "root_device", None) or self.device
