"""Every top-level config in configs/ parses like ``lfed fit --config <file> --print_config``
and instantiates; the local-objective configs (issue 3) mean what their names say and run."""

from pathlib import Path

import pytest
import torch
from conftest import REPO

from lfed.lightning.cli import LfedCLI, run_cli
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.state.stores import dense_rows

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
QUIET = ["--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false"]
OBJECTIVE_CONFIGS = [f"{a}_{d}" for a in ("fedprox", "scaffold", "igfl_c", "efl") for d in ("digits", "mnist")]


def _name(p: Path) -> str:
    return p.name


def test_the_objective_configs_exist():
    names = {p.stem for p in CONFIGS}
    assert {"quickstart", "fedavg_mnist", *OBJECTIVE_CONFIGS} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=_name)
def test_every_config_prints_its_full_config(path, capsys):
    """``--print_config`` parses the file against FederatedModule/FederatedDataModule and exits 0."""
    with pytest.raises(SystemExit) as exit_:
        run_cli(["fit", "--config", str(path), "--print_config"])
    assert exit_.value.code in (0, None)
    out = capsys.readouterr().out
    for key in ("model:", "algorithm:", "client_lr:", "data:", "num_clients:", "trainer:", "max_steps:"):
        assert key in out, key


def instantiate(path: Path, *extra: str) -> LfedCLI:
    return LfedCLI(FederatedModule, FederatedDataModule, run=False, save_config_callback=None,
                   args=["--config", str(path), *QUIET, *extra])


@pytest.mark.parametrize("path", CONFIGS, ids=_name)
def test_every_config_instantiates(path, tmp_path):
    cli = instantiate(path, f"--trainer.default_root_dir={tmp_path}")
    assert isinstance(cli.model, FederatedModule) and isinstance(cli.datamodule, FederatedDataModule)


EXPECTED = {  # (objective, weighting, partial_work, compression, extra attributes of the objective)
    "fedprox": ("prox", "size", "keep", None, {"mu": 0.01}),
    "scaffold": ("scaffold", "uniform", "keep", None, {}),
    "igfl_c": ("igfl", "size", "keep", None, {}),
    "efl": ("efl", "size", "scale", 0.1, {"lam": 0.1, "fisher_samples": 32}),
}


@pytest.mark.parametrize("stem", OBJECTIVE_CONFIGS)
def test_objective_configs_compose_what_their_names_say(stem, tmp_path):
    cli = instantiate(REPO / "configs" / f"{stem}.yaml", f"--trainer.default_root_dir={tmp_path}")
    m, d = cli.model, cli.datamodule
    objective, weighting, partial, compression, attrs = EXPECTED[stem.rsplit("_", 1)[0]]
    c = m.composition
    assert (m.objective.name, c["weighting"], c["partial_work"], c["channel"], c["combination"]) == (
        objective, weighting, partial, compression, "mean")
    for k, v in attrs.items():
        assert getattr(m.objective, k) == v
    mnist = stem.endswith("mnist")
    assert (d.dataset, d.num_clients, d.partition, d.rho) == (("mnist", 100, "dirichlet", 0.1) if mnist else ("digits", 20, "dirichlet", 0.5))
    plan = m.training_plan
    assert (plan.client_lr, plan.batch_size, plan.local_epochs, float(m.participation.fraction(0))) == (0.05, 10, 1, 0.1 if mnist else 0.25)
    opt = m.server_optimizer([torch.nn.Parameter(torch.zeros(1))])
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["lr"] == 1.0 and opt.defaults["momentum"] == 0


STATE = {"prox": [], "scaffold": ["objective.client_control", "objective.control"], "igfl": ["history.previous_update", "history.global_change"],
         "efl": ["objective.fisher_u", "objective.fisher_v", "objective.fisher_u_sum", "objective.fisher_v_sum"]}


def _entry(state: dict, name: str):
    """A tensor of the state dict: per-client rows come as sparse entries (lfed.state.stores), made dense here."""
    return dense_rows(state, name) if f"{name}.rows" in state else state[name]


def _fit(path, tmp_path, *extra):
    return run_cli(["fit", "--config", str(path), *QUIET, f"--trainer.default_root_dir={tmp_path}", *extra])


@pytest.mark.parametrize("stem", [s for s in OBJECTIVE_CONFIGS if s.endswith("digits")])
def test_digits_objective_configs_run(stem, tmp_path):
    """``lfed fit --config configs/<objective>_digits.yaml`` for 3 rounds: the rounds run, the
    objective's state fills, and the model stays finite."""
    cli = _fit(REPO / "configs" / f"{stem}.yaml", tmp_path, "--trainer.max_steps=3", "--trainer.val_check_interval=3")
    assert cli.trainer.global_step == 3
    state = cli.model.state_dict()
    for name in STATE[cli.model.objective.name]:
        assert _entry(state, name).abs().sum() > 0, name
    assert torch.isfinite(cli.model.layout.module_vector(cli.model.net)).all()
    assert 0.0 <= float(cli.trainer.callback_metrics["test/acc"]) <= 1.0


@pytest.mark.parametrize("stem", [s for s in OBJECTIVE_CONFIGS if s.endswith("mnist")])
def test_mnist_objective_configs_run(stem, tmp_path, data_dir):
    """The MNIST configs run on the real data (2 rounds of 3 local steps, to stay fast)."""
    cli = _fit(REPO / "configs" / f"{stem}.yaml", tmp_path, f"--data.data_dir={data_dir}", "--trainer.max_steps=2",
               "--trainer.val_check_interval=2", "--model.training.local_steps=3")
    assert cli.trainer.global_step == 2
    assert cli.model.layout.num_params == 199_210
    state = cli.model.state_dict()
    for name in STATE[cli.model.objective.name]:
        assert _entry(state, name).shape[-1] == 199_210
    assert 0.0 <= float(cli.trainer.callback_metrics["test/acc"]) <= 1.0


def test_the_mnist_method_configs_compare_methods_not_partitions():
    """Issue 66 item 3: FedAvg, FedProx, SCAFFOLD, IGFL-C and EFL on MNIST share their data, model, training plan,
    participation and rounds; only the method differs."""
    import yaml

    def shared(stem):
        c = yaml.safe_load((REPO / "configs" / f"{stem}.yaml").read_text())
        m = c["model"]
        return (c["data"], c["trainer"]["max_steps"], c["seed_everything"], m["net"], m["training"], m["fraction"])

    base = shared("fedavg_mnist")
    assert base[0]["partition"] == "dirichlet" and base[0]["rho"] == 0.1
    for stem in ("fedprox_mnist", "scaffold_mnist", "igfl_c_mnist", "efl_mnist"):
        assert shared(stem) == base, stem
