"""configs/paper/: every YAML parses and instantiates through LfedCLI; compositions mean what
the README says; the LEAF FEMNIST and Shakespeare configs run real rounds on shared/data."""

import math
from pathlib import Path

import pytest
import torch
from conftest import REPO

from lfed.lightning.cli import LfedCLI, run_cli
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
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
    assert (m.objective.name, m.composition["combination"]) == expected


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
    assert (m.objective.name, m.composition["partial_work"], m.composition["channel"]) == ("plain", "drop", None)
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
                          ["--model.training.local_steps=1", "--model.training.batch_size=4"])
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
                          ["--model.training.local_steps=1", "--model.training.batch_size=4", "--model.net.init_args.hidden=8",
                           "--model.net.init_args.num_layers=1", "--data.eval_batch_size=4096"])
    d = cli.datamodule.data
    assert d.num_clients == 10 and int(d.client_sizes.sum() + d.holdout_sizes.sum()) == 41990
    assert cli.trainer.global_step == 2 and cli.model.comm.uploads == 20
    assert math.isfinite(float(cli.trainer.callback_metrics["test/loss"]))


STUDIES = sorted((PAPER / "grids").glob("*.yaml"))


def _protocol():
    import sys

    sys.path.insert(0, str(REPO / "benchmarks" / "studies"))
    import paper_protocol

    return paper_protocol


class _Points:
    """Parse and instantiate many points of one study: the first through :func:`instantiate` (LfedCLI itself), the others
    with that LfedCLI's parser (lfed's short names resolved as LfedCLI does). Building LfedCLI's parser is about half of
    an instantiation's time, and every point of a study is parsed by the same parser."""

    def __init__(self) -> None:
        self.cli: LfedCLI | None = None

    def __call__(self, *configs: Path, extra: list[str]):
        from lfed.lightning.cli_args import resolve_short_names

        if self.cli is None:
            self.cli = instantiate(*configs, extra=extra)
            return self.cli.config, self.cli.datamodule
        args = resolve_short_names([a for c in configs for a in ("--config", str(c))] + QUIET + list(extra))
        config = self.cli.parser.parse_args(args)
        built = self.cli.parser.instantiate_classes(config)
        assert isinstance(built["model"], FederatedModule) and isinstance(built["data"], FederatedDataModule)
        return config, built["data"]


@pytest.mark.parametrize("path", STUDIES, ids=_rel)
def test_every_study_file_reads_and_each_method_instantiates_at_its_grid_points(path):
    """configs/paper/grids/ (benchmarks/studies/paper_protocol.py): every method with every grid value parses."""
    study = _protocol().load_study(path)
    assert len(study.seeds) >= 3 and study.methods and study.rounds > 0
    point = _Points()
    for method in study.methods:
        least = 3 if study.metric == "personal" else 4  # the personalized studies: 3 lr values (7 methods on 2 cores)
        assert all(len(values) >= least for values in method.grid.values()), f"{method.name}: a grid of at least {least} values"
        for key, values in method.grid.items():
            for value in values:
                fixed = [f"--{k}=0.1" for k in method.fixed_from]  # a value the named method would choose
                got, data = point(*study.base, method.config,
                                  extra=[*study.overrides, *method.overrides, *fixed, f"--{key}={value}", "--data.data_dir=/nonexistent"])
                for part in key.split("."):
                    got = got[part]
                assert got == value, f"{path.name}: {method.name}: {key}={value} did not reach the config"
        if study.overrides and any("validation_fraction" in o for o in study.overrides):
            assert data.validation_fraction > 0


ONE_METHOD = "methods:\n  A: {config: configs/paper/igfl/alg_fedavg.yaml, grid: {model.training.client_lr: [0.1]}}\n"


def _refused(tmp_path, text: str, match: str) -> None:
    """A study file of ``text`` (after a minimal head) is refused by load_study with ``match`` in the error."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("title: t\nbase: []\n" + text)
    with pytest.raises(ValueError, match=match):
        _protocol().load_study(bad)


def test_a_study_file_with_a_bad_reference_is_refused(tmp_path):
    _refused(tmp_path, "rounds: 2\nseeds: [0]\nreference: Nobody\n" + ONE_METHOD, "reference: 'Nobody' is not one of the methods")
    _refused(tmp_path, "rounds: 2\nseeds: [0]\nmethods:\n  A: {config: configs/paper/igfl/alg_fedavg.yaml, "
             "grid: {model.training.client_lr: [0.1]}, fixed_from: {model.training.client_lr: B}}\n", "must be a method listed before it")


def _fake_run(accs: list[float], per_round: int = 10, every: int = 2):
    """A recorded run evaluated every ``every`` rounds with ``per_round`` uploads a round."""
    from paper_results import Run

    history = [{"round": every * (i + 1), "acc": a, "val_acc": a, "client_acc": None, "uploads": per_round * every * (i + 1)}
               for i, a in enumerate(accs)]
    return Run("fake", history, {"final/test_acc_last10pct": accs[-1], "final/val_acc_last10pct": accs[-1]}, 1.0, [])


def test_first_reach_is_the_first_evaluation_at_or_above_the_target():
    pp = _protocol()
    history = [{"round": 2, "acc": 0.5, "uploads": 20}, {"round": 4, "acc": 0.91, "uploads": 40},
               {"round": 6, "acc": 0.89, "uploads": 70}, {"round": 8, "acc": 0.95, "uploads": 110}]
    assert pp.first_reach(history, 0.9) == (4, 40)
    assert pp.first_reach(history, 0.91) == (4, 40)  # >= counts; the dip at round 6 does not undo it
    assert pp.first_reach(history, 0.93) == (8, 110)
    assert pp.first_reach(history, 0.96) is None
    assert pp.first_reach([], 0.5) is None


def test_reach_cell_averages_over_the_seeds_that_reached_and_counts_them():
    pp = _protocol()
    a, b, c = _fake_run([0.5, 0.92, 0.93]), _fake_run([0.5, 0.6, 0.91]), _fake_run([0.5, 0.6, 0.7])
    assert pp.reach_cell([a, b], 0.9) == "5 ± 1 / 50 ± 14"  # rounds 4, 6; uploads 40, 60
    assert pp.reach_cell([a, b, c], 0.9) == "5 ± 1 / 50 ± 14 (2/3 reached)"
    assert pp.reach_cell([a], 0.9) == "4 ± 0 / 40 ± 0"
    assert pp.reach_cell([c], 0.9) == "not reached"


def test_targets_key_adds_a_rounds_uploads_column_per_target(monkeypatch):
    import dataclasses

    pp = _protocol()
    study = pp.load_study(PAPER / "grids" / "adafl_uploads.yaml")
    assert study.targets == sorted(study.targets) and 0.9 in study.targets
    study = dataclasses.replace(study, targets=[0.9, 0.95])

    def result():
        runs = [_fake_run([0.5, 0.92, 0.96]), _fake_run([0.5, 0.6, 0.91]), _fake_run([0.5, 0.6, 0.7])]
        point = {"model.training.client_lr": 0.1}
        return {"grid": [(point, 0.9, runs[0])], "point": point, "runs": runs, "edge": [], "keys": ["model.training.client_lr"]}

    res = {m.name: result() for m in study.methods}
    monkeypatch.setattr(pp, "git_head", lambda: "abc")
    lines = pp.section(study, res, "cmd", 60.0, (0.0, 0.0), quick=False)
    header = next(line for line in lines if line.startswith("| method"))
    assert "| to 90%: rounds / uploads | to 95%: rounds / uploads |" in header
    sep = lines[lines.index(header) + 1]
    assert sep.count("|") == header.count("|")
    row = next(line for line in lines if line.startswith(f"| {study.reference} |"))
    assert row.count("|") == header.count("|")
    assert "| 5 ± 1 / 50 ± 14 (2/3 reached) | 6 ± 0 / 60 ± 0 (1/3 reached) |" in row
    assert "counted on test accuracy as the paper does" in "\n".join(lines)
    plain = dataclasses.replace(study, targets=[])
    assert "rounds / uploads" not in "\n".join(pp.section(plain, res, "cmd", 60.0, (0.0, 0.0), quick=False))


def test_longer_key_adds_the_chosen_points_longer_runs_paired_against_the_reference_s_longer_runs(monkeypatch, tmp_path):
    import dataclasses

    pp = _protocol()
    for longer in ("300", "200", "true"):
        _refused(tmp_path, f"rounds: 300\nseeds: [0]\nlonger: {longer}\n" + ONE_METHOD,
                 "longer: the rounds of the longer runs, an integer above rounds")
    study = dataclasses.replace(pp.load_study(PAPER / "grids" / "dwfed_rho1.yaml"), longer=400)
    ref_name, other = study.reference, next(m.name for m in study.methods if m.name != study.reference)

    def result(short, long):
        point = {"model.training.client_lr": 0.1}
        runs = [_fake_run(a) for a in short]
        return {"grid": [(point, 0.9, runs[0])], "point": point, "runs": runs, "edge": [], "keys": ["model.training.client_lr"],
                "longer": [_fake_run(a) for a in long]}

    # the last evaluation is the last-10% window (_fake_run); the longer runs decide the last three cells
    res = {ref_name: result([[0.5, 0.8, 0.80], [0.5, 0.8, 0.82]], [[0.5, 0.80, 0.85], [0.5, 0.85, 0.85]]),
           other: result([[0.5, 0.8, 0.81], [0.5, 0.8, 0.81]], [[0.5, 0.87, 0.87], [0.5, 0.82, 0.84]])}
    monkeypatch.setattr(pp, "git_head", lambda: "abc")
    lines = pp.section(study, res, "cmd", 60.0, (0.0, 0.0), quick=False)
    header = next(line for line in lines if line.startswith("| method"))
    assert header.endswith(f"| at 400 rounds: test last-10% (%) mean ± std | settled | vs {ref_name}, paired (pts) |")
    sep = lines[lines.index(header) + 1]
    rows = [line for line in lines if line.startswith(f"| {ref_name} |") or line.startswith(f"| {other} |")]
    assert sep.count("|") == header.count("|") and all(row.count("|") == header.count("|") for row in rows)
    ref_row, other_row = rows
    assert ref_row.endswith("| 85.00 ± 0.00 | – | – |")  # settled: needs evaluations before the last 10%; here none
    # paired on the longer runs: (0.87 - 0.85, 0.84 - 0.85) = (+2, -1) points -> +0.50 ± 2.12, 1 of 2 better
    assert other_row.endswith("| 85.50 ± 2.12 | – | +0.50 ± 2.12 (1/2 seeds better) |")
    assert "| 81.00 ± 0.00 |" in other_row and "+0.00 ± 1.41 (1/2 seeds better)" in other_row  # the short runs
    assert "ran again for 400 rounds on every seed" in "\n".join(lines)


def test_a_study_file_with_targets_in_percent_is_refused(tmp_path):
    _refused(tmp_path, "rounds: 2\nseeds: [0]\ntargets: [90]\n" + ONE_METHOD, "targets: a list of test accuracies in")


def test_adafl_method_files_resolve_to_the_paper_s_samplers_and_fractions():
    """configs/paper/adafl/: layered after the AdaFL base, FedAvg rows sample uniformly (the base's
    sampler_alpha is unused), the fractions are constant or ramp 0.1 -> 0.5 in the stated stages."""
    base = PAPER / "adafl_mnist.yaml"
    expected = {  # file -> (sampler, fraction at rounds 0, 39, 40, 59, 60, 120, 160, 199)
        "alg_fedavg_01": ("uniform", [0.1] * 8),
        "alg_fedavg_05": ("uniform", [0.5] * 8),
        "alg_dyn_fedavg_60": ("uniform", [0.1, 0.1, 0.1, 0.1, 0.2, 0.3, 0.3, 0.4]),
        "alg_dyn_fedavg_40": ("uniform", [0.1, 0.1, 0.2, 0.2, 0.2, 0.4, 0.5, 0.5]),
        "alg_adafl_40": ("attention", [0.1, 0.1, 0.2, 0.2, 0.2, 0.4, 0.5, 0.5]),
    }
    for stem, (sampler, fractions) in expected.items():
        cli = instantiate(base, PAPER / "adafl" / f"{stem}.yaml", extra=["--data.data_dir=/nonexistent", "--model.training.batch_size=50"])
        m = cli.model
        assert m.composition["sampler"] == sampler, stem
        assert (m.composition["objective"], m.composition["combination"], m.composition["weighting"]) == ("plain", "mean", "size")
        schedule = m.participation.fraction
        assert [float(schedule(r, 200)) for r in (0, 39, 40, 59, 60, 120, 160, 199)] == fractions, stem
        assert m.training_plan.batch_size == 50 and cli.datamodule.partition == "shards"
    assert m.sampler.alpha == 0.9
