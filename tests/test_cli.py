"""End to end through the real CLI entry: `lfed fit` on digits and on MNIST."""

import subprocess
import sys

import pytest

from conftest import REPO
from lfed.cli import run_cli


def test_quickstart_digits_learns_through_the_cli(tmp_path):
    cli = run_cli(
        [
            "fit",
            "--config", str(REPO / "configs/quickstart.yaml"),
            "--trainer.max_steps", "30",
            "--trainer.val_check_interval", "15",
            "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger", "false",
        ]
    )
    acc = float(cli.trainer.callback_metrics["test/acc"])
    assert cli.trainer.global_step == 30
    assert acc > 0.5, acc  # 10 classes: chance is 0.1


def test_mnist_from_data_dir_learns_through_the_cli(tmp_path, data_dir):
    cli = run_cli(
        [
            "fit",
            "--config", str(REPO / "configs/fedavg_mnist.yaml"),
            "--data.data_dir", str(data_dir),
            "--trainer.max_steps", "10",
            "--trainer.val_check_interval", "10",
            "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger", "false",
        ]
    )
    acc = float(cli.trainer.callback_metrics["test/acc"])
    assert acc > 0.4, acc  # pathological 2-shard split, 10 rounds; chance is 0.1


def test_console_script_prints_a_complete_config():
    out = subprocess.run([sys.executable, "-m", "lfed.cli", "fit", "--print_config"], capture_output=True, text=True, check=True).stdout
    for key in ("model:", "algorithm: fedavg", "server_optimizer", "data:", "num_clients", "partition", "max_steps"):
        assert key in out


def test_unknown_algorithm_is_refused_with_the_allowed_names():
    with pytest.raises(ValueError, match="algorithm: 'fedsgd' is not one of .*scaffold"):
        run_cli(["fit", "--model.algorithm", "fedsgd", "--trainer.logger", "false"])
