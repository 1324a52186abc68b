"""``lfed fit|validate|test --config ...``: LightningCLI over FederatedModule and FederatedDataModule.

Defaults that make a federated run read well: validation counts rounds
(``val_check_interval`` rounds, no per-epoch check, no sanity check), checkpoints every
``val_check_interval`` rounds with ``last.ckpt``, and Weights & Biases logging — online when
the user is logged in, offline otherwise (``WANDB_MODE`` is respected, ``disabled`` turns it off).
"""

from __future__ import annotations

import netrc
import os
import sys

from lightning.pytorch.cli import LightningCLI

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
    run_cli(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    main()
