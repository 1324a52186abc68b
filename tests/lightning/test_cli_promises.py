"""The command line keeps the README's promise (issue 41): each mistake a new user makes is one line naming the
argument, exit status 2, and leaves no run directory behind; what a run promises to show, it shows.

Most tests call the console script's entry point in-process (tests/lightning/test_cli_errors.py's ``run_main``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO
from test_cli_errors import QUICK, base, run_main

from lfed.lightning.cli import run_cli

PERSONAL = REPO / "configs" / "personal_digits.yaml"


def runs_left(root: Path) -> list[Path]:
    return sorted(p for p in (root / "runs").rglob("*")) if (root / "runs").exists() else []


def one_error_line(err: str, sub: str = "fit") -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith(f"lfed {sub}: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def quick_checkpoint(tmp_path: Path, *extra: str) -> Path:
    run_cli(["fit", "--config", str(QUICK), "--trainer.max_steps", "1", "--checkpoint_every", "1", "--trainer.logger", "false",
             "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path), *extra])
    [ckpt] = list((tmp_path / "runs").rglob("last.ckpt"))
    return ckpt


# ------------------------------------------------------------------------------- 1. a preset against a component


def test_a_preset_and_an_objective_that_contradict_it_are_refused_in_one_line(tmp_path, monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, ["fit", "--config", str(PERSONAL), "--model.algorithm", "fedrep",
                                               "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path)])
    line = one_error_line(err)
    assert code == 2
    assert line.startswith("lfed fit: error: model.objective: Ditto contradicts algorithm='fedrep', whose objective is FedRep")
    assert "--model.objective null" in line
    assert runs_left(tmp_path) == []


def test_the_preset_alone_trains_what_it_names(tmp_path):
    cli = run_cli(["fit", "--config", str(PERSONAL), "--model.algorithm", "fedrep", "--model.objective", "null",
                   "--trainer.max_steps", "1", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
                   "--trainer.default_root_dir", str(tmp_path)])
    assert type(cli.model.objective).__name__ == "FedRep"


# ------------------------------------------------------------------------------- 2. validate/test need a checkpoint


@pytest.mark.parametrize("sub", ["validate", "test"])
def test_validate_and_test_without_a_checkpoint_are_refused(sub, tmp_path, monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, [sub, "--config", str(QUICK), "--trainer.default_root_dir", str(tmp_path)])
    line = one_error_line(err, sub)
    assert code == 2 and line.startswith(f"lfed {sub}: error: ckpt_path: lfed {sub} scores a trained model")
    assert runs_left(tmp_path) == []


def test_a_config_that_contradicts_the_checkpoint_is_refused_and_its_own_config_is_not(tmp_path, monkeypatch, capsys):
    ckpt = quick_checkpoint(tmp_path / "fit")
    other = REPO / "configs" / "fedprox_digits.yaml"
    code, err = run_main(monkeypatch, capsys, ["test", "--config", str(other), "--ckpt_path", str(ckpt),
                                               "--trainer.default_root_dir", str(tmp_path / "test")])
    line = one_error_line(err, "test")
    assert code == 2 and line.startswith(f"lfed test: error: ckpt_path: {ckpt} was written by another configuration")
    assert "model.algorithm: checkpoint 'fedavg', config 'fedprox'" in line
    assert runs_left(tmp_path / "test") == []
    cli = run_cli(["test", "--config", str(QUICK), "--ckpt_path", str(ckpt), "--trainer.logger", "false",
                   "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path / "own")])
    assert cli.trainer.callback_metrics["test/acc"] > 0  # the run's own config: scored


def test_a_run_with_no_end_is_refused(tmp_path, monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--trainer.max_steps", "-1"])
    line = one_error_line(err)
    assert code == 2 and line == "lfed fit: error: trainer.max_steps: the rounds of the run, an integer >= 1, got -1 (a run with no end)"
    assert runs_left(tmp_path) == []


# ------------------------------------------------------------------------------- 5. a refusal leaves nothing behind


def test_a_refusal_during_set_up_leaves_no_run_directory_or_wandb_run(tmp_path, monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--model.algorithm", "dp_fedavg", "--model.weighting", "size"])
    line = one_error_line(err)
    assert code == 2 and "weighting" in line
    assert runs_left(tmp_path) == []


# ------------------------------------------------------------------------------- 4. the README's grid command


def test_the_readmes_grid_command_runs_as_written_with_an_override_as_fit_takes_it(tmp_path, monkeypatch):
    import re
    import shlex
    import shutil

    from lfed.lightning.grid import run_grid

    [command] = re.findall(r"`(lfed grid [^`]+)`", (REPO / "README.md").read_text())
    words = shlex.split(command)
    assert "--trainer.max_steps" in words  # "--key value", as lfed fit takes it
    for word in words:  # the repository's files it names, at the same relative paths
        if word.endswith(".yaml"):
            (tmp_path / word).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / word, tmp_path / word)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    group, directory = run_grid([*words[2:], "--trainer.enable_progress_bar", "false"])
    steps = int(words[words.index("--trainer.max_steps") + 1])
    assert len(group.runs) == 2 and all(run.rounds_done == steps for run in group.runs)
    assert directory.parent == tmp_path / "grids"


# ------------------------------------------------------------------------------- 3. nested class_path settings

NESTED = {
    "dp_delta": ("dp_digits.yaml", "--model.combination.init_args.delta", "1.5",
                 "model.combination.init_args.delta: must be a finite number in (0, 1), got 1.5"),
    "ditto_lam": ("personal_digits.yaml", "--model.objective.init_args.lam", "-1",
                  "model.objective.init_args.lam: must be a finite number >= 0 (Ditto's coefficient λ), got -1.0"),
    "lora_rank": ("lora_digits.yaml", "--model.net.init_args.rank", "0", "model.net.init_args.rank: need an integer >= 1, got 0"),
}


@pytest.mark.parametrize("name", list(NESTED))
def test_a_nested_settings_error_is_lfeds_own_line_with_its_argument_path(name, tmp_path, monkeypatch, capsys):
    config, key, value, expected = NESTED[name]
    if name == "lora_rank":
        pytest.importorskip("peft")
    code, err = run_main(monkeypatch, capsys, ["fit", "--config", str(REPO / "configs" / config), key, value,
                                               "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path)])
    assert code == 2 and one_error_line(err) == f"lfed fit: error: {expected}"
    assert "Union subtypes" not in err


# ------------------------------------------------------------------------------- 6. a DP run's end shows ε, δ and z


def test_a_dp_runs_end_line_shows_epsilon_delta_and_the_calibrated_noise(tmp_path, monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr("lfed.lightning.driver.rank_zero_info", lambda message, *a, **k: lines.append(message))
    cli = run_cli(["fit", "--config", str(REPO / "configs" / "dp_digits.yaml"), "--trainer.max_steps", "2",
                   "--model.combination.init_args.noise_multiplier", "null", "--model.combination.init_args.target_epsilon", "8",
                   "--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path)])
    dp = cli.model.combination
    [end] = [m for m in lines if "final/privacy_epsilon=" in m]
    assert f"final/privacy_delta={dp.delta:.4g}" in end
    assert f"final/privacy_noise_multiplier={dp.noise_multiplier:.4g}" in end and dp.noise_multiplier > 0  # calibrated z
    assert 0 < cli.model.final_summary["final/privacy_epsilon"] <= 8


# ------------------------------------------------------------------------------- 7. where the data comes from


def test_the_readme_says_where_data_comes_from_and_a_missing_file_says_it_too(tmp_path, monkeypatch, capsys):
    readme = (REPO / "README.md").read_text()
    assert "--data.download true" in readme and "DIR/mnist/" in readme and "$LFED_DATA_DIR" in readme
    empty = tmp_path / "no-data"
    empty.mkdir()
    code, err = run_main(monkeypatch, capsys, ["fit", "--config", str(REPO / "configs" / "fedavg_mnist.yaml"),
                                               "--data.data_dir", str(empty), "--trainer.max_steps", "1",
                                               "--trainer.default_root_dir", str(tmp_path)])
    line = one_error_line(err)
    assert code == 2 and str(empty) in line and "--data.download true" in line
    assert runs_left(tmp_path) == []
