"""``lfed fit|validate|test --config ...``: LightningCLI over FederatedModule and FederatedDataModule.

Defaults that make a federated run read well:

* Every run writes into its own directory, ``<trainer.default_root_dir>/runs/<algorithm>-<dataset>-<config
  id>/version_<n>/`` (without ``default_root_dir``: the ``save_dir`` given to a W&B, CSV or TensorBoard logger, which
  then writes inside the run directory, else the current directory; the config id is a
  hash of the ``model``, ``data`` and ``seed_everything`` settings, :mod:`lfed.lightning.reporting`): ``config.yaml``,
  ``metrics.csv`` (every logged metric, one row per round), ``checkpoints/last.ckpt``, ``environment.json`` (what
  the run's bits depend on: versions, device, CPU capability, threads; one record per start or resume,
  docs/reproducibility.md) and the Weights & Biases run (``wandb/``). The Trainer's ``default_root_dir`` is that directory.
* An atomic ``last.ckpt`` every ``checkpoint_every`` rounds (10)
  (:class:`lfed.lightning.checkpoint.RoundCheckpoint` through :class:`lfed.lightning.checkpoint.AtomicCheckpointIO`; a
  ``ModelCheckpoint`` of your own in ``trainer.callbacks`` replaces it). ``--ckpt_path last`` resumes
  the latest run of the same configuration, in its own directory.
* ``lfed validate|test --ckpt_path X`` needs no config: the model and data settings come from the
  checkpoint.
* Validation counts rounds (``val_check_interval`` rounds, no per-epoch check, no sanity check), the
  progress bar counts rounds, and the end of ``fit`` prints the evaluations as a table.
* Weights & Biases logging, online when the user is logged in, offline otherwise; ``WANDB_MODE=disabled``
  turns W&B off (the metrics CSV is still written). The loggers' run config (W&B's config, a
  ``CSVLogger``'s ``hparams.yaml``) holds the run's settings under their config names
  (``model.seed``, ``data.seed``, ``seed_everything``, :func:`lfed.lightning.reporting.flat_settings`), in
  place of Lightning's merge of the module's and the datamodule's hyperparameters
  (``trainer.enable_autolog_hparams`` is off), which refuses a run whose ``model.seed`` and
  ``data.seed`` differ.
* One way to set the server optimizer, ``--model.server_optimizer``: Lightning's ``--optimizer`` and
  ``--lr_scheduler`` are refused with a message naming it.
* Short class names of lfed's models (``--model.net MLP``) mean :mod:`lfed.models.zoo`' classes, and
  ``--help`` lists at most a few of the hundreds of torch subclasses a type accepts.
* A mistake in the configuration is one line, ``lfed fit: error: <argument>: <what is allowed>``,
  and exit status 2 (:func:`main`): the parser's errors, and a ``ValueError``, ``TypeError`` or
  ``FileNotFoundError`` (what lfed's checks raise) from building the model, data and trainer or
  from setting up the run before its first round (data loading, ``setup``, ``on_fit_start``,
  checkpoint checks). An error once the first round has started, or any other exception, keeps
  its traceback; ``LFED_DEBUG=1`` shows the traceback of every error. :func:`run_cli` (the
  Python API) raises every exception as it is.
* A Ctrl-C once the rounds have begun: Lightning stops the run (exit status 1) and the last line says in which round,
  which checkpoint holds how many rounds, and the command that continues from it
  (:class:`lfed.lightning.run_dirs.ResumeNote`).

This module is the command (:class:`LfedCLI`, :func:`run_cli`, :func:`main`); its parts, one concern each:
:mod:`lfed.lightning.cli_args` (the command line before parsing: short names, refused arguments),
:mod:`lfed.lightning.cli_help` (``--help``), :mod:`lfed.lightning.cli_errors` (configuration errors in one line),
:mod:`lfed.lightning.run_dirs` (run directories, resume, evaluation of a checkpoint) and
:mod:`lfed.lightning.cli_loggers` (W&B and the metrics CSV).
"""

from __future__ import annotations

import os
import sys
from argparse import ArgumentError
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lfed.checks import HookError
from lfed.core.registry import settings_label
from lfed.core.settings import retired, upgrade_args
from lfed.lightning.checkpoint import RoundCheckpoint, install_atomic_io, read_checkpoint
from lfed.lightning.cli_args import REFUSED, SUBCOMMANDS, refused_in_args, resolve_short_names, unimportable_class_path
from lfed.lightning.cli_errors import (
    CONFIG_ERRORS,
    DEBUG_ENV,
    ConfigError,
    FirstStep,
    check_command,
    key_message,
    nested_message,
    one_line,
    with_full_key,
    yaml_message,
)
from lfed.lightning.cli_help import LfedHelpFormatter, describe_trainer_group
from lfed.lightning.cli_loggers import default_logger, logger_root, loggers_elsewhere, point_loggers_at_run
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.lightning.reporting import MetricsCSV, RoundProgressBar, RoundTable, config_id, run_name, silence_library_noise
from lfed.lightning.run_dirs import (
    CONFIG_KEY,
    RUN_DIR_ENV,
    ResumeNote,
    RunConfig,
    RunSaveConfig,
    check_config_fits_checkpoint,
    continued_run_dir,
    discard_run_dir,
    evaluation_dir,
    new_run_dir,
    resume_last,
    settings_of,
)


class LfedCLI(LightningCLI):
    """LightningCLI with round-based defaults, per-run directories and a config check.

    Lightning's ``--optimizer``/``--lr_scheduler`` are off (``auto_configure_optimizers=False``)
    and refused; the help lists subclasses briefly (:class:`LfedHelpFormatter`).

    Args:
        config_errors: Raise a mistake in the configuration as a :class:`ConfigError` with a
            one-line message: the parser's errors (the parser then raises instead of printing
            its usage and exiting), and a ``ValueError``, ``TypeError`` or ``FileNotFoundError``
            raised before the run's first step (:data:`CONFIG_ERRORS`, :class:`FirstStep`).
            Other exceptions, and any after the first step, are raised as they are.
    """

    def __init__(
        self,
        *args: Any,
        auto_configure_optimizers: bool = False,
        parser_kwargs: dict | None = None,
        config_errors: bool = False,
        **kwargs: Any,
    ) -> None:
        short: dict[str, Any] = {"formatter_class": LfedHelpFormatter}
        if config_errors:
            short["exit_on_error"] = False
        given = kwargs.get("args")
        words = sys.argv[1:] if given is None else given if isinstance(given, (list, tuple)) else []
        self.command_line = list(words)  # for the command that continues after a Ctrl-C (ResumeNote)
        commands = SUBCOMMANDS
        if words and words[0] in SUBCOMMANDS:
            # the parser of the command given only: each command's parser reads the signatures of the Trainer, the
            # module and the data module, and building all three took 0.6 of the 1 CPU s after the imports (issue 66)
            commands = (words[0],)
            self.subcommands = lambda: {words[0]: LfedCLI.subcommands()[words[0]]}  # type: ignore[method-assign]
        given_kwargs = {k: v for k, v in (parser_kwargs or {}).items() if k not in SUBCOMMANDS or k in commands}
        parser_kwargs = {**short, "prog": "lfed", "description": "lfed: federated learning on PyTorch Lightning (lfed --help lists the commands)",
                         **{s: dict(short) for s in commands}, **given_kwargs}
        self.first_step = FirstStep()
        kwargs.setdefault("save_config_callback", RunSaveConfig)  # config.yaml in the run's folder, whatever the loggers
        try:
            super().__init__(*args, auto_configure_optimizers=auto_configure_optimizers, parser_kwargs=parser_kwargs, **kwargs)
        except ArgumentError as err:
            if not config_errors:
                raise
            args = kwargs.get("args") if kwargs.get("args") is not None else sys.argv[1:]
            raise ConfigError(key_message(str(err), list(args), getattr(self, "parser", None)) or one_line(str(err))) from err
        except yaml.YAMLError as err:  # a --config file that is not YAML (a tab, an unclosed bracket)
            if not config_errors:
                raise
            raise ConfigError(yaml_message(kwargs.get("args") if kwargs.get("args") is not None else sys.argv[1:], err)) from err
        except CONFIG_ERRORS as err:
            if not self.first_step.started:  # a refusal during set-up: the run never was
                self._discard_run_dir()
            if not config_errors or (self.first_step.started and not isinstance(err, HookError)):
                raise
            settings_of_run = lambda: self._settings(self._subconfig())  # noqa: E731
            raise ConfigError(nested_message(str(err), settings_of_run)
                              or with_full_key(one_line(str(err)), settings_of_run)) from err

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's, without ``predict`` (a federated run has no predict step; ``lfed grid`` is :mod:`lfed.entry`'s)."""
        return {k: v for k, v in LightningCLI.subcommands().items() if k in SUBCOMMANDS}

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--checkpoint_every",
            type=int,
            default=10,
            help="Rounds between checkpoints (an atomic last.ckpt in <run directory>/checkpoints); "
            "0 turns lfed's default checkpoint off. Ignored when trainer.callbacks has a ModelCheckpoint.",
        )
        for key in REFUSED:  # so that a config file's `optimizer:` is refused too, not merely unknown
            parser.add_argument(f"--{key}", type=Any, default=None, help="Not supported: use --model.server_optimizer.")
        describe_trainer_group(parser)  # --help lists the Trainer settings a run uses most
        parser.set_defaults(
            {
                "trainer.max_steps": 100,
                "trainer.val_check_interval": 10,
                "trainer.check_val_every_n_epoch": None,
                "trainer.num_sanity_val_steps": 0,
                "trainer.logger": default_logger(),
                "trainer.log_every_n_steps": 1,
                "trainer.enable_model_summary": False,
                "trainer.enable_autolog_hparams": False,  # RunConfig logs the settings under their own names
            }
        )

    def parse_arguments(self, parser, args) -> None:
        """Parse ``args`` with lfed's short model names, refusing Lightning's optimizer arguments."""
        if not isinstance(args, (dict,)) and not hasattr(args, "as_dict"):
            args = list(sys.argv[1:] if args is None else args)
            refused = refused_in_args(args) or unimportable_class_path(args)
            if refused:
                parser.error(refused)
            try:
                _, old = upgrade_args(args)  # lfed 0.3's flat keys: refused in one line naming each new spelling
            except ValueError as err:
                parser.error(str(err))
            if old:
                parser.error(retired(old))
            args = resolve_short_names(args)
            self.given_args = args
            self.config = parser.parse_args(args)  # Lightning's parse_arguments, without its warning about sys.argv
        else:
            super().parse_arguments(parser, args)
        cfg = self.config.get(self.config.get("subcommand")) if self.config.get("subcommand") else self.config
        if cfg is not None:
            for key, message in REFUSED.items():
                if cfg.get(key) is not None:
                    parser.error(f"{key}: {message}")

    def _parse_ckpt_path(self) -> None:
        """Nothing: lfed reads ``--ckpt_path`` itself in :meth:`before_instantiate_classes`.

        Lightning's CLI calls this private method right after parsing to replace the model
        arguments of the config with the hyperparameters stored in a ``--ckpt_path`` file. lfed
        does not want that: for ``fit`` the config defines the run and the checkpoint only its
        state (a checkpoint of another run is refused with the differences listed,
        :func:`lfed.lightning.checkpoint.verify_fingerprint`); for ``validate``/``test`` the settings
        come from the checkpoint's own record of the run, model network included, and an
        unreadable file is reported as not an lfed checkpoint. There is no public hook that
        runs before Lightning's; tests/lightning/test_first_hour_cli.py fails if Lightning stops calling
        this method.
        """

    # ----------------------------------------------------------------- run directory, checkpoint
    def _subconfig(self):
        return self.config[self.subcommand] if self.subcommand else self.config

    def _settings(self, cfg) -> dict[str, Any]:
        return settings_of(cfg)

    def before_instantiate_classes(self) -> None:
        """Read ``--ckpt_path`` (settings for validate/test, ``last``), choose the run directory.

        In steps: refuse what cannot run (:func:`lfed.lightning.cli_errors.check_command`); an evaluation of a given
        checkpoint takes its run's settings (:meth:`_evaluated_settings`); the configuration's directory; what the
        checkpoint continues (:meth:`_resume`); an evaluation's seed and directory (:meth:`_prepare_evaluation`); a new
        run's directory; the Trainer and its loggers pointed there (:meth:`_use_run_dir`).
        """
        silence_library_noise()
        cfg = self._subconfig()
        ckpt = cfg.get("ckpt_path")
        trainer = cfg.get("trainer", {})
        root = self._root = Path(trainer.get("default_root_dir") or logger_root(trainer) or os.getcwd())  # or a logger's save_dir
        settings = self._settings(cfg)
        evaluating = self.subcommand in ("validate", "test")
        check_command(self.subcommand, cfg)
        if ckpt is not None and ckpt != "last" and evaluating:
            settings = self._evaluated_settings(str(ckpt), settings)
        data = settings["data"] or {}
        dataset = "custom" if data.get("train") is not None else data.get("dataset")  # a user's own data is not "digits"
        config_dir = root / "runs" / run_name(settings_label(settings["model"] or {}), dataset, config_id(settings))
        run_dir, settings = self._resume(cfg, ckpt, config_dir, settings)
        cfg = self._subconfig()  # reading a checkpoint's settings replaced self.config
        self._created_run_dir = None
        if evaluating:
            run_dir = self._prepare_evaluation(cfg) or run_dir
        if run_dir is None:
            run_dir, self._created_run_dir = new_run_dir(config_dir, root)
        self._use_run_dir(cfg, run_dir, settings)

    def _evaluated_settings(self, ckpt: str, given: dict[str, Any]) -> dict[str, Any]:
        """``lfed validate|test --ckpt_path <file>``: the settings the checkpoint records, applied to the config; a config
        of the command that contradicts them is refused."""
        settings = self._settings_from_checkpoint(ckpt)
        check_config_fits_checkpoint(ckpt, given, settings, getattr(self, "given_args", None))
        return settings

    def _resume(self, cfg, ckpt: Any, config_dir: Path, settings: dict[str, Any]) -> tuple[Path | None, dict[str, Any]]:
        """The run directory a ``fit --ckpt_path`` continues (None: a new one), and the run's settings (an evaluation of
        ``last``: the checkpoint's, applied to the config)."""
        if ckpt == "last":
            found = resume_last(cfg, config_dir, settings, self.subcommand)
            if found is not None and self.subcommand == "fit":
                return found.parent.parent, settings
            if found is not None and self.subcommand in ("validate", "test"):
                settings = self._settings_from_checkpoint(str(found))
            return None, settings
        if ckpt is not None and self.subcommand == "fit":
            return continued_run_dir(ckpt, config_dir), settings
        return None, settings

    def _prepare_evaluation(self, cfg) -> Path | None:
        """``validate``/``test``: seeded as the run, Lightning's warning about training callbacks silenced; the run
        directory of the checkpoint it scores (``<run>/validate/``), None for a checkpoint outside a run."""
        import warnings

        self._seed_as_the_run(cfg)
        # an evaluation restores the weights only: the training callbacks' state Lightning asks for is not needed
        warnings.filterwarnings("ignore", message=r"Be aware that when using `ckpt_path`, callbacks used to create")
        run_dir, self._created_run_dir = evaluation_dir(cfg.get("ckpt_path"), self.subcommand)
        return run_dir

    def _use_run_dir(self, cfg, run_dir: Path, settings: dict[str, Any]) -> None:
        """The run writes into ``run_dir``: the Trainer's ``default_root_dir``, the loggers', and DDP workers' (:data:`RUN_DIR_ENV`)."""
        os.environ[RUN_DIR_ENV] = str(run_dir)
        self.run_dir = run_dir
        self.run_settings = settings
        cfg["trainer"]["default_root_dir"] = str(run_dir)
        point_loggers_at_run(cfg["trainer"], run_dir, self.subcommand, cfg.get("ckpt_path"), getattr(self, "_root", None))

    def _set_seed(self) -> None:
        """Lightning's, except for ``validate``/``test`` without a seed of their own: they take the run's own seed from
        its checkpoint once it is read (:meth:`_seed_as_the_run`), instead of Lightning's "No seed found" and a seed
        of its choosing."""
        self._seed_deferred = self.subcommand in ("validate", "test") and self._get(self.config, "seed_everything") is True
        if not self._seed_deferred:
            super()._set_seed()

    def _seed_as_the_run(self, cfg) -> None:
        """Seed an evaluation as its run was seeded (the checkpoint's ``seed_everything``; 0 when it has none), when the
        command gave no seed of its own (then :meth:`_set_seed` already seeded with it)."""
        from lightning.fabric.utilities.seed import seed_everything

        if not getattr(self, "_seed_deferred", False):
            return
        seed = cfg.get("seed_everything")
        cfg["seed_everything"] = seed_everything(0 if isinstance(seed, bool) or seed is None else int(seed), workers=True)

    def before_fit(self) -> None:
        """Build the data before the Trainer starts anything (a W&B run, its files): a dataset that is not there, more
        clients than examples, a partition that cannot be made are one line with nothing left behind (issue 51 item 9).
        The Trainer's ``setup`` reuses what was built (:meth:`lfed.data.federated.FederatedDataset.build` is
        idempotent)."""
        build = getattr(self.datamodule, "build", None)
        if callable(build):
            build()

    before_validate = before_test = before_fit

    def instantiate_classes(self) -> None:
        """Lightning's, but a run that fails to start leaves no empty run directory behind."""
        try:
            super().instantiate_classes()
        except BaseException:
            created = getattr(self, "_created_run_dir", None)
            if created is not None and created.is_dir() and not any(created.iterdir()):
                self._discard_run_dir()
            raise

    def _discard_run_dir(self) -> None:
        """Remove the run directory this command made (:func:`lfed.lightning.run_dirs.discard_run_dir`): a run refused
        before its first step leaves nothing."""
        loggers = getattr(getattr(self, "trainer", None), "loggers", None)
        if discard_run_dir(getattr(self, "_created_run_dir", None), loggers):
            self._created_run_dir = None

    def _settings_from_checkpoint(self, ckpt: str) -> dict[str, Any]:
        """Apply the checkpoint's model and data settings to the config (validate/test); return them."""
        saved = read_checkpoint(ckpt).get(CONFIG_KEY)
        cfg = self._subconfig()
        if not saved:
            rank_zero_warn(
                f"ckpt_path: {ckpt} holds no record of its run's settings (not saved by `lfed fit`): "
                "the model and data settings of this command's config are used"
            )
            return self._settings(cfg)
        saved = {k: v for k, v in saved.items() if v is not None}
        data_dir = cfg.get("data", {}).get("data_dir") if cfg.get("data") is not None else None
        update = {k: saved[k] for k in ("model", "data") if k in saved}
        if data_dir is not None and "data" in update:
            update["data"] = {**update["data"], "data_dir": data_dir}  # where the data is on this machine
        new = self.parser.parse_object({self.subcommand: update}, self.config)
        self.config = new
        cfg = self._subconfig()
        if "seed_everything" in saved:
            cfg["seed_everything"] = saved["seed_everything"]
        return self._settings(cfg)

    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The Trainer, with lfed's checkpoint, progress bar, round table, metrics CSV and atomic IO."""
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        every = config.get("checkpoint_every", 10)
        if every is not None and every < 0:
            raise ValueError(f"checkpoint_every: must be >= 0 rounds (0 turns it off), got {every}")
        trainer_config = config.get("trainer", {})
        callbacks = trainer_config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        run_dir = getattr(self, "run_dir", None) or Path(trainer_config.get("default_root_dir") or os.getcwd())
        if (
            every
            and self.subcommand in ("fit", None)
            and trainer_config.get("enable_checkpointing") is not False
            and not any(isinstance(c, ModelCheckpoint) for c in callbacks)
        ):
            callbacks.append(RoundCheckpoint(dirpath=os.path.join(str(run_dir), "checkpoints"), every_n_train_steps=every))
        if trainer_config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(RoundProgressBar())
        if not any(isinstance(c, RoundTable) for c in callbacks):
            callbacks.append(RoundTable())
        callbacks.append(RunConfig(getattr(self, "run_settings", None) or self._settings(self._subconfig())))
        if self.subcommand == "fit":  # a Ctrl-C ends with the checkpoint to continue from and the command
            callbacks.append(ResumeNote(self.command_line, every))
        callbacks.append(self.first_step)
        kwargs.setdefault("callbacks", callbacks)
        logger = trainer_config.get("logger")
        loggers = [] if logger in (None, False) else list(logger) if isinstance(logger, list) else [logger]
        wants_log = logger is not False
        if wants_log and not any(isinstance(lg, MetricsCSV) for lg in loggers) and all(isinstance(lg, Logger) for lg in loggers):
            kwargs.setdefault("logger", [*loggers, MetricsCSV(run_dir)])
        trainer = super().instantiate_trainer(**kwargs)
        elsewhere = loggers_elsewhere(trainer.loggers, run_dir) if getattr(self, "run_dir", None) else None
        if elsewhere:  # a logger of the user's lfed cannot put inside the run's folder: where each is, in one line
            rank_zero_info(elsewhere)
        install_atomic_io(trainer.strategy)
        return trainer


def run_cli(args: list[str] | None = None) -> LfedCLI:
    """Run ``lfed`` with ``args`` (``sys.argv`` when None) and return the CLI object (tests, notebooks)."""
    silence_library_noise()
    return LfedCLI(FederatedModule, FederatedDataModule, save_config_kwargs={"overwrite": True}, args=args)


def _prog(args: list[str]) -> str:
    """``lfed fit`` (the subcommand of ``args``), or ``lfed`` without one."""
    sub = next((a for a in args if a in SUBCOMMANDS), None)
    return f"lfed {sub}" if sub else "lfed"


def main() -> None:
    """``lfed fit|validate|test`` (the ``lfed`` command, :func:`lfed.entry.main`, sends ``lfed grid`` to :mod:`lfed.lightning.grid`).

    A mistake in the configuration (:class:`ConfigError`) is printed as one line,
    ``lfed fit: error: <message>``, on stderr, and the exit status is 2; with ``LFED_DEBUG=1``
    every error shows its traceback (the parser's too: ``JSONARGPARSE_DEBUG``).
    """
    if "--help-all" in sys.argv[2:]:  # every Lightning Trainer setting, not only the ones a federated run uses most
        LfedHelpFormatter.full = True
        sys.argv = [a if a != "--help-all" else "--help" for a in sys.argv]
    if os.environ.get(DEBUG_ENV, "").strip() not in ("", "0"):
        os.environ.setdefault("JSONARGPARSE_DEBUG", "true")  # the parser raises instead of printing its usage
        run_cli()
        return
    silence_library_noise()
    ResumeNote.deferred = []
    try:
        LfedCLI(FederatedModule, FederatedDataModule, save_config_kwargs={"overwrite": True}, config_errors=True)
    except SystemExit:  # Lightning's exit after a Ctrl-C in a round: last, where the run can continue from (ResumeNote)
        if ResumeNote.deferred:
            wandb = sys.modules.get("wandb")
            if getattr(wandb, "run", None) is not None:
                wandb.finish(exit_code=1)  # its footer (how to sync an offline run) now, not after the line at exit
            for line in ResumeNote.deferred:
                print(line, file=sys.stderr, flush=True)
        raise
    except ConfigError as err:
        print(f"{_prog(sys.argv[1:])}: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except FloatingPointError as err:  # a run that diverged: its message names the round, the clients and the fix
        print(f"{_prog(sys.argv[1:])}: stopped: {err} ({DEBUG_ENV}=1 shows the traceback)", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C before round 0 (after it, Lightning stops the run itself, exit 1)
        print(f"{_prog(sys.argv[1:])}: interrupted before the first round; no run was kept", file=sys.stderr, flush=True)
        sys.exit(130)
    finally:
        ResumeNote.deferred = None


if __name__ == "__main__":  # pragma: no cover
    main()
