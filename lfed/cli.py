"""``lfed fit|validate|test --config ...``: LightningCLI over FederatedModule and FederatedDataModule.

Defaults that make a federated run read well: validation counts rounds
(``val_check_interval`` rounds, no per-epoch check, no sanity check), an atomic ``last.ckpt``
every ``checkpoint_every`` rounds (10) in ``<trainer.default_root_dir>/checkpoints``
(:class:`lfed.checkpoint.RoundCheckpoint` through :class:`lfed.checkpoint.AtomicCheckpointIO`;
resume with ``--ckpt_path last``; a ``ModelCheckpoint`` of your own in ``trainer.callbacks``
replaces it), and Weights & Biases logging — online when the user is logged in, offline
otherwise (``WANDB_MODE`` is respected, ``disabled`` turns it off).
"""

from __future__ import annotations

import netrc
import os

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from lfed.checkpoint import RoundCheckpoint, install_atomic_io
from lfed.data.datamodule import FederatedDataModule
from lfed.module import FederatedModule


def wandb_logged_in() -> bool:
    """Whether a W&B API key is configured (environment or ``~/.netrc``), without prompting."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
        return os.path.exists(path) and netrc.netrc(path).authenticators("api.wandb.ai") is not None
    except (netrc.NetrcParseError, OSError):
        return False


def default_logger() -> dict:
    """W&B logger config: offline unless logged in."""
    return {
        "class_path": "lightning.pytorch.loggers.WandbLogger",
        "init_args": {"project": "lfed", "save_dir": "runs", "offline": not wandb_logged_in()},
    }


class LfedCLI(LightningCLI):
    """LightningCLI with round-based defaults and a config check."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--checkpoint_every",
            type=int,
            default=10,
            help="Rounds between checkpoints (an atomic last.ckpt in <trainer.default_root_dir>/checkpoints); "
            "0 turns lfed's default checkpoint off. Ignored when trainer.callbacks has a ModelCheckpoint.",
        )
        parser.set_defaults(
            {
                "trainer.max_steps": 100,
                "trainer.val_check_interval": 10,
                "trainer.check_val_every_n_epoch": None,
                "trainer.num_sanity_val_steps": 0,
                "trainer.logger": default_logger(),
                "trainer.log_every_n_steps": 1,
                "trainer.enable_model_summary": False,
            }
        )

    def _parse_ckpt_path(self) -> None:
        """Keep the config authoritative when resuming a fit.

        Lightning's CLI replaces the model arguments of the config with the hyperparameters stored
        in a ``--ckpt_path`` file (not with ``--ckpt_path last``). For ``fit`` lfed does not: the
        config defines the run, the checkpoint only its state, and a checkpoint of another run is
        refused with the differences listed (:func:`lfed.checkpoint.verify_fingerprint`) instead
        of silently turning, say, ``algorithm: scaffold`` into the checkpoint's ``fedavg``.
        ``validate`` and ``test`` keep Lightning's behaviour.
        """
        if self.config.get("subcommand") == "fit":
            return
        parse = getattr(super(), "_parse_ckpt_path", None)
        if parse is not None:
            parse()

    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The Trainer, with lfed's default checkpoint callback and atomic checkpoint IO."""
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        every = config.get("checkpoint_every", 10)
        if every is not None and every < 0:
            raise ValueError(f"checkpoint_every: must be >= 0 rounds (0 turns it off), got {every}")
        trainer_config = config.get("trainer", {})
        callbacks = trainer_config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        if (
            every
            and trainer_config.get("enable_checkpointing") is not False
            and not any(isinstance(c, ModelCheckpoint) for c in callbacks)
        ):
            root = trainer_config.get("default_root_dir") or os.getcwd()
            callbacks.append(RoundCheckpoint(dirpath=os.path.join(str(root), "checkpoints"), every_n_train_steps=every))
            kwargs.setdefault("callbacks", callbacks)
        trainer = super().instantiate_trainer(**kwargs)
        install_atomic_io(trainer.strategy)
        return trainer


def run_cli(args: list[str] | None = None) -> LfedCLI:
    """Run ``lfed`` with ``args`` (``sys.argv`` when None) and return the CLI object (tests, notebooks)."""
    return LfedCLI(
        FederatedModule,
        FederatedDataModule,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


def main() -> None:
    """Entry point of the ``lfed`` console script."""
    run_cli()  # LightningCLI reads sys.argv itself


if __name__ == "__main__":  # pragma: no cover
    main()
