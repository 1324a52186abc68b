"""Shared helpers: a quiet Trainer that runs a few federated rounds."""

import os
from pathlib import Path

import pytest
from lightning.pytorch import Trainer

os.environ.setdefault("WANDB_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("LFED_DATA_DIR", REPO.parent / "shared" / "data"))


def run_rounds(module, datamodule, rounds, *, evaluate_every=None, precision="64-true", **kwargs):
    """Fit ``module`` for ``rounds`` rounds on the CPU with no logger, checkpoint or progress bar."""
    trainer = Trainer(
        max_steps=rounds,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        precision=precision,
        check_val_every_n_epoch=None,
        val_check_interval=evaluate_every or rounds,
        limit_val_batches=None if evaluate_every else 0,
        **kwargs,
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer


def flat_weights(module):
    return module.layout.module_vector(module.net)


@pytest.fixture
def data_dir():
    if not (DATA_DIR / "mnist").exists():
        pytest.fail(f"real data not found at {DATA_DIR}: set LFED_DATA_DIR to shared/data")
    return DATA_DIR
