"""Every shipped sweep's first grid point runs one round of `lfed fit`, with a logger on.

tests/lightning/test_sweep.py checks that the sweep files parse; here a point of each runs, as the W&B
agent or `lfed grid` would run it (the sweep's ``command`` base configs, then ``--key=value``
per parameter), with the default logger (the metrics CSV, ``WANDB_MODE=disabled``): a logger
is what made ``--model.seed 1`` fail before round 0 (Lightning's merge of the module's and
the datamodule's hyperparameters refused two different ``seed`` values).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger

from lfed import FederatedDataModule, FederatedModule
from lfed.lightning.cli import run_cli
from lfed.lightning.sweep import Sweep, load_sweep
from lfed.models.zoo import MLP

SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
QUICK = REPO / "configs" / "quickstart.yaml"


def absolute_configs(args: list[str]) -> list[str]:
    """The sweep's config paths (relative to the repository root) made absolute."""
    out, after_config = [], False
    for a in args:
        if after_config:
            a = str(REPO / a)
        elif a.startswith("--config="):
            a = "--config=" + str(REPO / a.split("=", 1)[1])
        after_config = a == "--config"
        out.append(a)
    return out


def point_args(sweep: Sweep, point: dict) -> list[str]:
    base = sweep.base_args or ["--config", str(QUICK)]
    return absolute_configs([*base, *Sweep.args_of(point)])


def run_point(args: list[str], root: Path, *extra: str):
    return run_cli(["fit", *args, "--trainer.max_steps", "1", "--trainer.enable_progress_bar", "false",
                    "--checkpoint_every", "0", "--trainer.default_root_dir", str(root), *extra])


@pytest.fixture
def sweep_env(monkeypatch, data_dir):
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the default logger: lfed's metrics CSV
    monkeypatch.setenv("LFED_DATA_DIR", str(data_dir))  # the sweeps' MNIST


def assert_one_logged_round(cli) -> None:
    assert cli.trainer.global_step == 1
    assert cli.trainer.loggers, "the run had no logger"
    with open(Path(cli.trainer.default_root_dir) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and rows[0]["rounds_done"] == "1" and rows[0]["train/loss"]


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_the_first_point_of_every_sweep_runs_a_round_with_a_logger(path, tmp_path, sweep_env):
    sweep = load_sweep(path)
    cli = run_point(point_args(sweep, sweep.points()[0]), tmp_path)
    assert_one_logged_round(cli)


def seed_points(sweep: Sweep) -> list[dict]:
    """The first point of each value of a swept ``*.seed`` parameter other than the first point's."""
    first = sweep.points()[0]
    out = []
    for key in (k for k in sweep.parameters if k.endswith(".seed")):
        other = next((p for p in sweep.points() if p[key] != first[key]), None)
        if other is not None:
            out.append(other)
    return out


SEED_POINTS = [(path, point) for path in SWEEPS for point in seed_points(load_sweep(path))]


def test_a_sweep_of_seeds_is_shipped():
    assert any(path.name == "adafl_alpha.yaml" for path, _ in SEED_POINTS)


@pytest.mark.parametrize("path,point", SEED_POINTS, ids=lambda x: x.stem if isinstance(x, Path) else None)
def test_a_point_with_another_model_seed_than_the_datas_runs_with_a_logger(path, point, tmp_path, sweep_env):
    cli = run_point(point_args(load_sweep(path), point), tmp_path)
    assert cli.model.seed != cli.datamodule.seed
    assert_one_logged_round(cli)


def test_the_run_config_keeps_the_model_seed_and_the_data_seed_apart(tmp_path, sweep_env):
    cli = run_point(["--config", str(QUICK), "--model.seed=1", "--data.seed=2"], tmp_path,
                    "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(tmp_path / "csv"))
    assert cli.trainer.global_step == 1
    [hparams] = (tmp_path / "csv").rglob("hparams.yaml")
    logged = yaml.safe_load(hparams.read_text())
    assert (logged["model.seed"], logged["data.seed"], logged["seed_everything"]) == (1, 2, 0)
    assert logged["model.training.client_lr"] == 0.05 and logged["data.dataset"] == "digits"


def test_the_python_api_runs_a_model_seed_other_than_the_datas_with_a_logger(tmp_path):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 8, generator=g), torch.randint(0, 3, (200,), generator=g)
    data = FederatedDataModule.from_tensors(x[:160], y[:160], x[160:], y[160:], num_clients=4, seed=0)
    module = FederatedModule(MLP(in_features=8, hidden=[8], num_classes=3), fraction=0.5, seed=1)
    trainer = Trainer(max_steps=1, accelerator="cpu", logger=CSVLogger(tmp_path), enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 1
