"""One run, one folder, whatever the logger (issue 66 item 7).

``lfed fit --trainer.logger lightning.pytorch.loggers.CSVLogger --trainer.logger.save_dir logs`` used to split the run:
``config.yaml``, the logger's files and the histogram in ``logs/lightning_logs/version_0``, the checkpoint and lfed's
``metrics.csv`` in ``runs/.../version_0``. A logger's ``save_dir`` is now where the run's folder goes
(``logs/runs/<name>/version_<n>/``) and the logger writes inside it; a logger lfed cannot place is named in one line.
"""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import REPO
from lightning.pytorch.loggers import CSVLogger, Logger

from lfed.lightning.cli import run_cli
from lfed.lightning.cli_loggers import logger_root, loggers_elsewhere

QUICK = REPO / "configs" / "quickstart.yaml"


def fit(*extra: str, rounds: int = 2):
    return run_cli(["fit", "--config", str(QUICK), "--trainer.max_steps", str(rounds), "--trainer.val_check_interval", "2",
                    "--checkpoint_every", "2", "--trainer.enable_progress_bar", "false", *extra])


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_a_csv_logger_of_ones_own_keeps_the_whole_run_in_one_folder_and_last_resumes_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logger = ["--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", "logs"]
    cli = fit(*logger)
    run = Path(cli.trainer.default_root_dir).resolve()
    [made] = sorted((tmp_path / "logs" / "runs").glob("*/version_*"))
    assert run == made.resolve() and run.name == "version_0"
    everything = files_under(tmp_path)
    assert everything and all(p.resolve().is_relative_to(run) for p in everything), everything  # nothing beside it
    assert not (tmp_path / "runs").exists() and not (tmp_path / "logs" / "lightning_logs").exists()
    for name in ("config.yaml", "metrics.csv", "checkpoints/last.ckpt", "environment.json", "personal_accuracy.png",
                 "lightning_logs/version_0/metrics.csv", "lightning_logs/version_0/hparams.yaml"):
        assert (run / name).is_file(), (name, everything)
    assert (run / "metrics.csv").read_text().startswith("step,rounds_done,")  # lfed's: one row per round
    # the same command with --ckpt_path last continues that run in that folder (the logger's next version inside it)
    resumed = fit(*logger, "--ckpt_path", "last", rounds=4)
    assert Path(resumed.trainer.default_root_dir).resolve() == run
    assert sorted((tmp_path / "logs" / "runs").glob("*/version_*")) == [made]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
    assert (run / "lightning_logs" / "version_1" / "metrics.csv").is_file()
    assert all(p.resolve().is_relative_to(run) for p in files_under(tmp_path))


class AwayLogger(Logger):
    """A logger that keeps its files where it likes (as MLflow keeps its store): lfed cannot put it in the run folder."""

    def __init__(self, where: str = "elsewhere") -> None:
        super().__init__()
        self.where = where

    name = property(lambda self: "away")
    version = property(lambda self: "0")
    save_dir = property(lambda self: self.where)

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        pass


def test_a_logger_lfed_cannot_place_is_named_in_one_line_and_the_config_stays_in_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said: list[str] = []  # read from the calls: whether Lightning's loggers reach caplog depends on the import order
    for module in ("lfed.lightning.cli", "lfed.lightning.driver"):
        monkeypatch.setattr(f"{module}.rank_zero_info", lambda message, *a, **k: said.append(message))
    cli = fit("--trainer.logger", f"{__name__}.AwayLogger", "--trainer.logger.where", str(tmp_path / "store"))
    run = Path(cli.trainer.default_root_dir)
    assert run.resolve().is_relative_to((tmp_path / "runs").resolve())
    assert (run / "config.yaml").is_file() and (run / "metrics.csv").is_file()  # not in the logger's folder
    assert not (tmp_path / "store").exists()
    lines = [line for line in said if "keeps its own files" in line]
    assert lines == [f"lfed: this run's folder is {run} (config.yaml, metrics.csv, checkpoints); AwayLogger in "
                     f"{tmp_path / 'store'} keeps its own files"]
    assert said.index(lines[0]) < next(i for i, m in enumerate(said) if m.startswith("lfed: fedavg on "))  # at the start


def test_a_save_dir_given_besides_default_root_dir_stays_and_is_named(tmp_path, monkeypatch):
    """Two places given (``--trainer.default_root_dir`` and a logger's ``save_dir``): each is honoured, and said."""
    said: list[str] = []
    monkeypatch.setattr("lfed.lightning.cli.rank_zero_info", lambda message, *a, **k: said.append(message))
    cli = fit("--trainer.default_root_dir", str(tmp_path / "root"), "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
              "--trainer.logger.save_dir", str(tmp_path / "csv"))
    run = Path(cli.trainer.default_root_dir)
    assert run.resolve().is_relative_to((tmp_path / "root" / "runs").resolve()) and (run / "config.yaml").is_file()
    assert (tmp_path / "csv" / "lightning_logs" / "version_0" / "metrics.csv").is_file()
    assert [m for m in said if "keeps its own files" in m] == [
        f"lfed: this run's folder is {run} (config.yaml, metrics.csv, checkpoints); CSVLogger in {tmp_path / 'csv'} "
        "keeps its own files"]


def test_where_a_run_goes_by_its_loggers_settings(tmp_path):
    csv = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "logs"}}
    wandb = {"class_path": "lfed.lightning.reporting.QuietWandbLogger", "init_args": {"save_dir": None}}
    assert logger_root({"logger": csv}) == "logs"
    assert logger_root({"logger": [wandb, csv]}) == "logs"  # the first logger that was given a save_dir
    assert logger_root({"logger": wandb}) is None and logger_root({"logger": False}) is None
    inside = CSVLogger(tmp_path / "run")
    assert loggers_elsewhere([inside], tmp_path / "run") is None
    line = loggers_elsewhere([inside, AwayLogger(str(tmp_path / "a")), AwayLogger("")], tmp_path / "run")
    assert line.endswith(f"AwayLogger in {tmp_path / 'a'}, AwayLogger (no local folder) keep their own files")
