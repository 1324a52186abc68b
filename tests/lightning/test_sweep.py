"""sweeps/: every W&B sweep drives `lfed fit` through `${args}` with valid CLI keys.

The W&B agent expands ``${args}`` to ``--<parameter>=<value>`` for each parameter, the
value formatted with Python's ``str`` (wandb ``sweeps/utils.create_sweep_command_args``):
``model.training.client_lr: 0.001`` becomes ``--model.training.client_lr=0.001``. These tests build the same
strings and hand them to lfed's own CLI parser.
"""

from pathlib import Path

import pytest
import yaml
from conftest import REPO

from lfed.lightning.cli import LfedCLI, run_cli
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule

SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
HEAD = ["${env}", "lfed", "fit"]


def load(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def wandb_args(params: dict[str, object]) -> list[str]:
    """``${args}`` as the W&B agent writes it for one sampled point."""
    return [f"--{name}={value}" for name, value in params.items()]


def parameter_values(spec: dict) -> list:
    if "values" in spec:
        return list(spec["values"])
    if "value" in spec:
        return [spec["value"]]
    raise AssertionError(f"only grid parameters (value/values) are used in lfed's sweeps, got {spec}")


def command_configs(command: list[str]) -> list[str]:
    """The arguments between ``lfed fit`` and ``${args}`` (the base config flags)."""
    assert command[:3] == HEAD and command[-1] == "${args}", command
    return command[3:-1]


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and "class_path" not in v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def walk(d: dict, key: str) -> object:
    for part in key.split("."):
        d = d[part]
    return d


def test_the_three_sweeps_exist():
    assert {p.name for p in SWEEPS} >= {"igfl_client_lr.yaml", "igfl_algorithm_by_rho.yaml", "adafl_alpha.yaml"}


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_sweep_runs_lfed_fit_with_args_and_existing_configs(path):
    sweep = load(path)
    assert sweep["method"] == "grid" and sweep["program"] == "lfed"
    assert sweep["metric"]["name"] in {"final/test_acc_last10pct", "test/acc"}
    base = command_configs(sweep["command"])
    assert base[0] == "--config" and (REPO / base[1]).is_file()
    for spec in sweep["parameters"].values():
        assert parameter_values(spec)
    if "config" in sweep["parameters"]:
        for value in sweep["parameters"]["config"]["values"]:
            assert (REPO / value).is_file(), value


def test_igfl_client_lr_grid_is_the_papers():
    """000 §5.1: eta_l in {1e-3, 3e-3, ..., 1e-1, 3e-1}."""
    values = load(REPO / "sweeps" / "igfl_client_lr.yaml")["parameters"]["model.training.client_lr"]["values"]
    assert values == [0.001, 0.003, 0.01, 0.03, 0.1, 0.3]


def test_algorithm_by_rho_grid_covers_table_2():
    params = load(REPO / "sweeps" / "igfl_algorithm_by_rho.yaml")["parameters"]
    assert params["data.rho"]["values"] == [1000, 1.0, 0.1]
    names = {Path(v).stem for v in params["config"]["values"]}
    assert {"alg_fedavg", "alg_fedavgm", "alg_scaffold", "alg_fedadam_tau0.1", "alg_fedadam_tau0.01",
            "alg_igfl_c", "alg_igfl_s_global", "alg_igfl_global"} <= names


def _cases():
    for path in SWEEPS:
        sweep = load(path)
        for name, spec in sweep["parameters"].items():
            for value in parameter_values(spec):
                yield pytest.param(path, name, value, id=f"{path.stem}:{name}={value}")


@pytest.mark.parametrize("path,name,value", list(_cases()))
def test_every_sweep_value_is_a_valid_cli_argument(path, name, value, monkeypatch, tmp_path):
    """``--name=value`` after the sweep's base config parses and instantiates the module and data."""
    monkeypatch.chdir(REPO)  # the agent runs from the repository root
    base = command_configs(load(path)["command"])
    args = [*base, *wandb_args({name: value}), "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"]
    cli = LfedCLI(FederatedModule, FederatedDataModule, run=False, args=args, save_config_callback=None)
    assert isinstance(cli.model, FederatedModule)


def test_an_unknown_key_is_refused_so_the_check_above_can_fail(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit):
        LfedCLI(FederatedModule, FederatedDataModule, run=False,
                args=["--config", "configs/paper/igfl/cross_device_mnist.yaml", "--model.client_learning_rate=0.1",
                      "--trainer.logger=false"], save_config_callback=None)


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_the_first_sampled_command_parses_to_the_sampled_values(path, monkeypatch, capsys):
    """Take the first value of every parameter, expand the command as W&B does, print the config."""
    monkeypatch.chdir(REPO)
    sweep = load(path)
    point = {name: parameter_values(spec)[0] for name, spec in sweep["parameters"].items()}
    command = sweep["command"][:-1] + wandb_args(point)
    assert command[:3] == HEAD
    with pytest.raises(SystemExit) as stop:
        run_cli(["fit", *command[3:], "--print_config"])
    assert stop.value.code in (0, None)
    nested = yaml.safe_load(capsys.readouterr().out)
    printed = flatten(nested)
    expected = dict(point)
    if "config" in expected:  # the second config's own keys must show in the merged result
        expected.update(flatten(load(REPO / expected.pop("config"))))
    for key, value in expected.items():
        got = printed[key] if key in printed else walk(nested, key)  # a component's own setting: model.sampler.init_args.alpha
        if isinstance(value, dict):  # class_path / init_args
            assert got["class_path"].endswith(value["class_path"].split(".")[-1])
            for k, v in value.get("init_args", {}).items():
                assert got["init_args"][k] == v, (key, k)
        else:
            assert got == value, (key, got, value)
