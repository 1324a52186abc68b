"""configs/paper/: every YAML parses and instantiates through LfedCLI; compositions mean what
the README says; the LEAF FEMNIST and Shakespeare configs run real rounds on shared/data."""

import math
from pathlib import Path

import pytest
import torch
from conftest import REPO

from lfed.cli import LfedCLI, run_cli
from lfed.data.datamodule import FederatedDataModule
from lfed.module import FederatedModule
from lfed.server.optimizers import FedAdam

PAPER = REPO / "configs" / "paper"
ALL_CONFIGS = sorted(p for p in PAPER.rglob("*.yaml") if p.parent.name != "grids")  # grids/: study files, below
QUIET = ["--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false"]


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def instantiate(*configs: Path, extra: list[str] | None = None) -> LfedCLI:
    """Parse ``configs`` in order (LightningCLI composition) and build model, data and trainer."""
    args = [a for c in configs for a in ("--config", str(c))] + QUIET + list(extra or [])
    return LfedCLI(FederatedModule, FederatedDataModule, run=False, args=args, save_config_callback=None)


def test_the_paper_configs_exist():
    names = {_rel(p) for p in ALL_CONFIGS}
    for expected in (
        "configs/paper/igfl/cross_silo_cifar10.yaml",
        "configs/paper/igfl/cross_device_cifar10.yaml",
        "configs/paper/igfl/cross_device_emnist.yaml",
        "configs/paper/igfl/cross_device_mnist.yaml",
        "configs/paper/igfl/alg_fedadam_tau0.1.yaml",
        "configs/paper/igfl/alg_igfl_s_time.yaml",
        "configs/paper/leaf/femnist.yaml",
        "configs/paper/leaf/shakespeare.yaml",
        "configs/paper/efl/noniid_mnist.yaml",
        "configs/paper/dwfed/noniid_mnist.yaml",
    ):
        assert expected in names


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=_rel)
def test_every_paper_config_parses_and_instantiates(path, tmp_path):
    cli = instantiate(path, extra=[f"--trainer.default_root_dir={tmp_path}"])
    assert isinstance(cli.model, FederatedModule)
    assert isinstance(cli.datamodule, FederatedDataModule)


ALG_FILES = sorted((PAPER / "igfl").glob("alg_*.yaml"))


@pytest.mark.parametrize("alg", ALG_FILES, ids=_rel)
def test_igfl_algorithm_files_compose_with_a_base(alg):
    """base + alg: the base's data and local settings stay, the algorithm comes from the alg file."""
    cli = instantiate(PAPER / "igfl" / "cross_device_mnist.yaml", alg)
    m, d = cli.model, cli.datamodule
    assert (d.num_clients, d.partition, m.training_plan.batch_size, m.training_plan.local_epochs) == (100, "dirichlet", 100, 1)
    assert float(m.participation.fraction(0)) == 0.1
    stem = alg.stem.removeprefix("alg_")
    expected = {  # (objective, aggregation) of each file, SPEC §2 and §4
        "fedavg": ("plain", "mean"), "fedavgm": ("plain", "mean"), "scaffold": ("scaffold", "mean"),
        "fedadam_tau0.1": ("plain", "mean"), "fedadam_tau0.01": ("plain", "mean"), "igfl_c": ("igfl", "mean"),
        "igfl_s_self": ("plain", "self"), "igfl_s_global": ("plain", "global"), "igfl_s_time": ("plain", "time"),
        "igfl_self": ("igfl", "self"), "igfl_global": ("igfl", "global"), "igfl_time": ("igfl", "time"),
        "feddyn": ("feddyn", "feddyn"),
    }[stem]
    assert (m.objective.name, m.composition["aggregation"]) == expected


@pytest.mark.parametrize("tau", [0.1, 0.01])
def test_fedadam_tau_files_build_fedadam_with_that_tau(tau):
    cli = instantiate(PAPER / "igfl" / "cross_device_mnist.yaml", PAPER / "igfl" / f"alg_fedadam_tau{tau}.yaml")
    opt = cli.model.server_optimizer([torch.nn.Parameter(torch.zeros(3))])
    assert isinstance(opt, FedAdam)
    assert opt.defaults["tau"] == tau and opt.defaults["lr"] == 0.01


def test_fedavgm_file_is_sgd_with_momentum_0_9_and_lr_1():
    cli = instantiate(PAPER / "igfl" / "cross_silo_mnist.yaml", PAPER / "igfl" / "alg_fedavgm.yaml")
    opt = cli.model.server_optimizer([torch.nn.Parameter(torch.zeros(3))])
    assert isinstance(opt, torch.optim.SGD)
    assert (opt.defaults["lr"], opt.defaults["momentum"]) == (1.0, 0.9)
    assert cli.datamodule.partition == "shards" and float(cli.model.participation.fraction(0)) == 1.0


def test_efl_fedavg_drop_file_drops_partial_work_but_keeps_the_straggler_rates():
    cli = instantiate(PAPER / "efl" / "low_participation_mnist.yaml", PAPER / "efl" / "alg_fedavg_drop.yaml")
    m = cli.model
    assert (m.objective.name, m.composition["partial_work"], m.composition["compression"]) == ("plain", "drop", None)
    assert (m.participation.stragglers.p_inactive, m.participation.stragglers.p_incomplete) == (0.2, 0.3)


def _run_two_rounds(config: Path, tmp_path: Path, data_dir: Path, extra: list[str]):
    cli = run_cli(
        ["fit", "--config", str(config), f"--data.data_dir={data_dir}", "--trainer.max_steps=2",
         "--trainer.val_check_interval=2", f"--trainer.default_root_dir={tmp_path}", *QUIET, *extra]
    )
    return cli


def test_femnist_config_runs_two_rounds_on_the_natural_writer_split(tmp_path, data_dir):
    torch.manual_seed(0)
    cli = _run_two_rounds(PAPER / "leaf" / "femnist.yaml", tmp_path, data_dir,
                          ["--model.local_steps=1", "--model.batch_size=4"])
    d = cli.datamodule.data
    # 105 writers, 14,708 training images in the 20 shared shards (shared/data/SOURCES.md);
    # 10% of each writer's images are held out for client-side accuracy.
    assert d.num_clients == 105 and int(d.client_sizes.sum() + d.holdout_sizes.sum()) == 14708
    assert cli.trainer.global_step == 2
    assert cli.model.comm.uploads == 2 * 11  # C = 0.1 of 105 writers: round(10.5) = 11 per round
    acc = float(cli.trainer.callback_metrics["test/acc"])
    assert 0.0 <= acc <= 1.0 and math.isfinite(float(cli.trainer.callback_metrics["test/loss"]))


def test_shakespeare_config_runs_two_rounds_on_the_natural_role_split(tmp_path, data_dir):
    torch.manual_seed(0)
    cli = _run_two_rounds(PAPER / "leaf" / "shakespeare.yaml", tmp_path, data_dir,
                          ["--model.local_steps=1", "--model.batch_size=4", "--model.net.init_args.hidden=8",
                           "--model.net.init_args.num_layers=1", "--data.eval_batch_size=4096"])
    d = cli.datamodule.data
    assert d.num_clients == 10 and int(d.client_sizes.sum() + d.holdout_sizes.sum()) == 41990
    assert cli.trainer.global_step == 2 and cli.model.comm.uploads == 20
    assert math.isfinite(float(cli.trainer.callback_metrics["test/loss"]))


STUDIES = sorted((PAPER / "grids").glob("*.yaml"))


def _protocol():
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import paper_protocol

    return paper_protocol


@pytest.mark.parametrize("path", STUDIES, ids=_rel)
def test_every_study_file_reads_and_each_method_instantiates_at_its_grid_points(path):
    """configs/paper/grids/ (benchmarks/paper_protocol.py): every method with every grid value parses."""
    study = _protocol().load_study(path)
    assert len(study.seeds) >= 3 and study.methods and study.rounds > 0
    for method in study.methods:
        assert all(len(values) >= 4 for values in method.grid.values()), f"{method.name}: a grid of at least 4 values"
        for key, values in method.grid.items():
            for value in values:
                fixed = [f"--{k}=0.1" for k in method.fixed_from]  # a value the named method would choose
                cli = instantiate(*study.base, method.config,
                                  extra=[*study.overrides, *method.overrides, *fixed, f"--{key}={value}", "--data.data_dir=/nonexistent"])
                got = cli.config
                for part in key.split("."):
                    got = got[part]
                assert got == value, f"{path.name}: {method.name}: {key}={value} did not reach the config"
        if study.overrides and any("validation_fraction" in o for o in study.overrides):
            assert cli.datamodule.validation_fraction > 0


def test_a_study_file_with_a_bad_reference_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("title: t\nbase: []\nrounds: 2\nseeds: [0]\nreference: Nobody\n"
                   "methods:\n  A: {config: configs/paper/igfl/alg_fedavg.yaml, grid: {model.client_lr: [0.1]}}\n")
    with pytest.raises(ValueError, match="reference: 'Nobody' is not one of the methods"):
        _protocol().load_study(bad)
    bad.write_text("title: t\nbase: []\nrounds: 2\nseeds: [0]\n"
                   "methods:\n  A: {config: configs/paper/igfl/alg_fedavg.yaml, grid: {model.client_lr: [0.1]},"
                   " fixed_from: {model.client_lr: B}}\n")
    with pytest.raises(ValueError, match="must be a method listed before it"):
        _protocol().load_study(bad)
