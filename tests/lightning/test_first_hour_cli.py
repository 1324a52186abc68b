"""Issue 14, a researcher's first hour with `lfed`: where things go, what the terminal says, wrong inputs.

Each test names the issue item it covers. In-process runs go through ``run_cli`` with
``--trainer.default_root_dir``; the few subprocess runs check what a user's terminal shows.
"""

from __future__ import annotations

import csv
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO

from lfed.lightning.checkpoint import AtomicCheckpointIO, NotACheckpointError, read_checkpoint, verify_fingerprint
from lfed.lightning.cli import run_cli
from lfed.lightning.cli_args import resolve_short_names
from lfed.lightning.cli_help import shorten_subclass_list
from lfed.lightning.cli_loggers import default_logger
from lfed.lightning.reporting import MetricsCSV, RoundTable, config_id, latest_checkpoint

QUICK = REPO / "configs" / "quickstart.yaml"


def quick(tmp_path: Path, *extra: str, rounds: int = 4, sub: str = "fit", config: Path | None = QUICK):
    args = [sub]
    if config is not None:
        args += ["--config", str(config)]
    if sub == "fit":
        args += ["--trainer.max_steps", str(rounds), "--trainer.val_check_interval", "2", "--checkpoint_every", "2"]
    args += ["--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path), *extra]
    return run_cli(args)


def lfed_subprocess(tmp_path: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    base.update({"PYTHONPATH": str(REPO), "NETRC": str(tmp_path / "no-netrc"), **(env or {})})
    return subprocess.run([sys.executable, "-m", "lfed.lightning.cli", *args], cwd=tmp_path, env=base, capture_output=True,
                          text=True, timeout=600, check=check)


def runs_of(root: Path) -> list[Path]:
    return sorted(root.glob("runs/*/version_*"))


# ----------------------------------------------------------------------------- item 1: WANDB_MODE=disabled


@pytest.fixture(scope="module")
def disabled_fit(tmp_path_factory):
    """One ``lfed fit`` of the quickstart in a terminal-like subprocess, W&B disabled, 4 rounds, evaluated every 2: its
    folder and its output (read by the W&B test here and by the progress-bar test of item 12; one process for both)."""
    root = tmp_path_factory.mktemp("disabled_fit")
    fit = lfed_subprocess(root, "fit", "--config", str(QUICK), "--trainer.max_steps", "4", "--trainer.val_check_interval", "2",
                          env={"WANDB_MODE": "disabled"})
    return root, fit


def test_wandb_mode_disabled_writes_no_wandb_run_but_still_a_metrics_csv(disabled_fit):
    root, out = disabled_fit
    assert not [p for p in root.rglob("*") if "wandb" in p.name], out.stdout + out.stderr  # no offline run directory
    [run] = runs_of(root)
    assert (run / "metrics.csv").is_file() and (run / "checkpoints" / "last.ckpt").is_file()


def test_default_logger_follows_wandb_mode(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert default_logger()["class_path"] == "lfed.lightning.reporting.MetricsCSV"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert default_logger()["class_path"] == "lfed.lightning.reporting.QuietWandbLogger"


# ----------------------------------------------------------------------------- item 3: one server optimizer


@pytest.mark.parametrize(
    "args",
    [
        ["--optimizer", "torch.optim.Adam"],
        ["--optimizer", "torch.optim.SGD", "--optimizer.lr", "0"],
        ["--optimizer.lr=0"],
        ["--lr_scheduler", "torch.optim.lr_scheduler.StepLR"],
    ],
    ids=["adam", "sgd-lr0", "lr-only", "scheduler"],
)
def test_lightning_optimizer_arguments_are_refused_naming_the_server_optimizer(args, capsys):
    with pytest.raises(SystemExit):
        run_cli(["fit", *args])
    assert "--model.server_optimizer" in capsys.readouterr().err


def test_an_optimizer_in_a_config_file_is_refused_too(tmp_path, capsys):
    cfg = tmp_path / "opt.yaml"
    cfg.write_text(yaml.safe_dump({"optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.001}}}))
    with pytest.raises(SystemExit):
        run_cli(["fit", "--config", str(cfg)])
    assert "--model.server_optimizer" in capsys.readouterr().err


def test_the_fit_summary_line_shows_the_server_optimizer(tmp_path, monkeypatch):
    # read from the call itself: whether Lightning's loggers reach caplog depends on the import order
    lines = []
    monkeypatch.setattr("lfed.lightning.driver.rank_zero_info", lambda message, *a, **k: lines.append(message))
    quick(tmp_path, "--trainer.logger", "false", "--model.server_optimizer", "lfed.server.optimizers.FedAdam",
          "--model.server_optimizer.lr", "0.01", rounds=1)
    [line] = [m for m in lines if m.startswith("lfed: fedavg on")]
    assert "server_optimizer=FedAdam(lr=0.01" in line, line


# ----------------------------------------------------------------------------- item 7: garbage checkpoints


@pytest.mark.parametrize("sub", ["fit", "validate", "test"])
def test_a_garbage_checkpoint_is_not_an_lfed_checkpoint_and_no_unsafe_load_is_suggested(tmp_path, sub):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(os.urandom(4096))
    with pytest.raises(NotACheckpointError, match="bad.ckpt is not an lfed checkpoint") as info:
        quick(tmp_path, "--trainer.logger", "false", "--ckpt_path", str(bad), sub=sub)
    assert "weights_only" not in str(info.value)


def test_a_pickle_of_arbitrary_objects_is_refused_without_loading_it(tmp_path):
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "global_step": 0, "x": Path("somewhere")}, evil)  # not allowed by weights_only
    with pytest.raises(NotACheckpointError) as info:
        read_checkpoint(evil)
    assert "weights_only" not in str(info.value)
    with pytest.raises(NotACheckpointError, match="not an lfed checkpoint"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "evil.ckpt", weights_only=True)
    with pytest.raises(NotACheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "missing.ckpt")


# ----------------------------------------------------------------------------- item 8: checkpoints per run


def test_each_run_has_its_own_directory_and_last_resumes_the_same_configuration(tmp_path):
    a1 = quick(tmp_path, "--trainer.logger", "false")
    a2 = quick(tmp_path, "--trainer.logger", "false")
    b = quick(tmp_path, "--trainer.logger", "false", "--model.training.client_lr", "0.1")  # another configuration, ran last
    dirs = {Path(c.trainer.checkpoint_callback.dirpath).parent for c in (a1, a2, b)}
    assert len(dirs) == 3 and len(runs_of(tmp_path)) == 3
    assert all((d / "checkpoints" / "last.ckpt").is_file() for d in dirs)
    assert not list(tmp_path.rglob("last-v*.ckpt"))  # no last-v1.ckpt pile-up
    a_dir = Path(a2.trainer.checkpoint_callback.dirpath).parent
    assert Path(a1.trainer.checkpoint_callback.dirpath).parent.parent == a_dir.parent  # same configuration, same parent
    assert Path(b.trainer.checkpoint_callback.dirpath).parent.parent != a_dir.parent

    resumed = quick(tmp_path, "--trainer.logger", "false", "--ckpt_path", "last", rounds=6)
    assert Path(resumed.trainer.ckpt_path) == a_dir / "checkpoints" / "last.ckpt"  # a's latest run, not b's
    assert Path(resumed.trainer.checkpoint_callback.dirpath).parent == a_dir  # it continues in that run's directory
    assert resumed.trainer.global_step == 6 and len(runs_of(tmp_path)) == 3
    assert latest_checkpoint(a_dir.parent) == a_dir / "checkpoints" / "last.ckpt"


def test_last_without_a_checkpoint_of_this_configuration_starts_a_new_run(tmp_path):
    """Nothing of this method and data to resume: ``last`` starts a new run, and says so."""
    with pytest.warns(UserWarning, match="found no checkpoint of this configuration"):
        cli = quick(tmp_path, "--trainer.logger", "false", "--model.training.client_lr", "0.2", "--ckpt_path", "last", rounds=2)
    assert cli.trainer.ckpt_path is None and cli.trainer.global_step == 2


def test_last_with_a_changed_setting_is_refused_naming_the_run_it_did_not_continue(tmp_path, monkeypatch, capsys):
    """Issue 51 item 2: "resume with a lower lr" (``--model.training.client_lr 0.1 --ckpt_path last``) finds no checkpoint
    of the new configuration; a run of the same method and data has one. It used to train fresh rounds, exit 0, with a
    warning among W&B's lines; now one line names that checkpoint, the setting that differs and both ways on, exit 2,
    and nothing is left behind. Giving that checkpoint continues it with the new setting (a ResumeWarning names it)."""
    import sys

    from lfed.lightning.cli import main

    quick(tmp_path, "--trainer.logger", "false")
    [last] = (tmp_path / "runs").glob("*/version_0/checkpoints/last.ckpt")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "runs").rglob("*"))
    monkeypatch.setattr(sys, "argv", ["lfed", "fit", "--config", str(QUICK), "--trainer.max_steps", "6", "--trainer.logger", "false",
                                      "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path),
                                      "--model.training.client_lr", "0.02", "--ckpt_path", "last"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert info.value.code == 2
    assert err[-1] == (f"lfed fit: error: ckpt_path: 'last' found no checkpoint of this configuration, but {last} is a run of "
                       "the same method and data with other settings (model.training.client_lr: 0.05 there, 0.02 here); to "
                       f"continue it with these settings give --ckpt_path {last}, to start a new run drop --ckpt_path")
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "runs").rglob("*")) == before  # nothing left behind
    with pytest.warns(UserWarning, match="client_lr"):
        cli = quick(tmp_path, "--trainer.logger", "false", "--model.training.client_lr", "0.02", "--ckpt_path", str(last), rounds=6)
    assert cli.trainer.global_step == 6 and Path(cli.trainer.ckpt_path) == last


def test_a_run_that_fails_to_start_leaves_no_empty_run_directory(tmp_path, capsys):
    # refused by the module (a bad value of the right type) after the run directory was chosen
    with pytest.raises(ValueError, match="client_lr"):
        quick(tmp_path, "--trainer.logger", "false", "--model.training.client_lr", "-1")
    assert not (tmp_path / "runs").exists()  # nothing at all: the run folder and the runs/ it made
    # refused while parsing (algorithm is a Literal of the presets): no run directory either
    with pytest.raises(SystemExit):
        quick(tmp_path, "--trainer.logger", "false", "--model.algorithm", "fedsgd")
    assert "model.algorithm" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_config_id_is_stable_and_sensitive():
    a = {"model": {"algorithm": "fedavg", "client_lr": 0.05}, "data": {"dataset": "digits"}, "seed_everything": 0}
    assert config_id(a) == config_id({"seed_everything": 0, "data": {"dataset": "digits"}, "model": {"client_lr": 0.05, "algorithm": "fedavg"}})
    assert config_id(a) != config_id({**a, "seed_everything": 1})


# ----------------------------------------------------------------------------- item 9: CSV and end-of-run table


def test_a_run_leaves_a_metrics_csv_and_prints_a_table_of_its_evaluations(tmp_path, capsys):
    cli = quick(tmp_path, rounds=4)  # the default logger (W&B, disabled here) plus the CSV
    run = Path(cli.trainer.default_root_dir)
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"step", "rounds_done", "train/loss", "test/acc", "test/loss", "client/acc_mean",
            "client/acc_worst10pct"} <= set(rows[0]) and "client/acc_worst10" not in rows[0]  # 0.4's name: not since 0.6
    evaluated = [r for r in rows if r["test/acc"]]
    assert [int(r["rounds_done"]) for r in evaluated] == [2, 4]
    # one row per round, the final/* summary on the last one (0.4 added a row of a fifth round that never ran)
    assert [int(r["rounds_done"]) for r in rows] == [1, 2, 3, 4] and rows[-1]["final/test_acc"]
    assert float(evaluated[-1]["test/acc"]) == pytest.approx(float(cli.trainer.callback_metrics["test/acc"]))
    out = capsys.readouterr().out
    assert "rounds done  test acc  test loss  client acc mean  client acc worst 10%" in out
    table = out.split("lfed: evaluations of the global model")[1].splitlines()[2:4]
    assert [ln.split()[0] for ln in table] == ["2", "4"]
    assert float(table[1].split()[1]) == pytest.approx(float(cli.trainer.callback_metrics["test/acc"]), abs=1e-4)


def test_round_table_keeps_its_rows_in_the_checkpoint_and_thins_long_runs():
    t = RoundTable(max_rows=3)
    t.rows = [{"round": float(r), "test/acc": r / 100} for r in range(10, 110, 10)]
    u = RoundTable()
    u.load_state_dict(t.state_dict())
    assert u.rows == t.rows
    lines = t.table().splitlines()
    assert "10 evaluations, 3 shown" in lines[0] and [ln.split()[0] for ln in lines[2:]] == ["10", "50", "100"]


def test_metrics_csv_continues_a_resumed_run_and_replaces_rounds_after_the_checkpoint(tmp_path):
    first = MetricsCSV(tmp_path)
    for step in range(5):
        first.log_metrics({"train/loss": float(step)}, step=step)
    first.finalize("success")
    resumed = MetricsCSV(tmp_path)  # a run killed after round 4 resumes from a checkpoint after round 2
    resumed.log_metrics({"train/loss": 30.0}, step=3)
    resumed.finalize("success")
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], float(r["train/loss"])) for r in rows] == [("0", 0.0), ("1", 1.0), ("2", 2.0), ("3", 30.0)]


# ----------------------------------------------------------------------------- item 11: help and short names


def test_help_is_readable(tmp_path):
    out = lfed_subprocess(tmp_path, "fit", "--help").stdout
    lines = out.splitlines()
    assert len(lines) < 600, len(lines)  # 2,317 lines before, most of them lists of torch classes; 759 with every Trainer flag
    assert "--trainer.max_steps" in out and "--trainer.gradient_clip_val" not in out  # the Trainer settings a run uses
    assert "more are Lightning's own: --help-all lists them all" in " ".join(out.split())
    assert "lfed.models.MLP" in out and "more (any importable class path)" in out
    assert "--optimizer CONFIG" not in out
    assert lines[0].startswith("usage: lfed [options] fit ")  # not __main__.py (issue 51 item 11)
    assert "SPEC" not in out  # the help cites docs/algorithms.md, which users have
    assert "docs/algorithms.md §" in out


def test_help_all_lists_every_trainer_setting(monkeypatch, capsys):
    from lfed.lightning.cli import main
    from lfed.lightning.cli_help import LfedHelpFormatter

    monkeypatch.setattr(sys, "argv", ["lfed", "fit", "--help-all"])
    monkeypatch.setattr(LfedHelpFormatter, "full", False)
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--trainer.gradient_clip_val" in out and "--trainer.max_steps" in out and "--help-all lists them" not in out


def test_short_model_names_mean_lfeds_models(tmp_path):
    assert resolve_short_names(["fit", "--model.net", "MLP"]) == ["fit", "--model.net", "lfed.models.MLP"]
    assert resolve_short_names(["--model.net=SmallCNN"]) == ["--model.net=lfed.models.SmallCNN"]
    assert resolve_short_names(["--model.net", "torchvision.ops.MLP"]) == ["--model.net", "torchvision.ops.MLP"]
    cli = quick(tmp_path, "--trainer.logger", "false", "--model.net", "MLP", "--model.net.in_features", "64",
                "--model.net.hidden", "[16]", "--model.net.num_classes", "10", rounds=1)
    assert type(cli.model.net).__module__ == "lfed.models.zoo" and type(cli.model.net).__name__ == "MLP"


def test_shorten_subclass_list_keeps_lfeds_classes_and_counts_the_rest():
    text = "The net (default: null, known subclasses: torch.nn.Module, lfed.models.zoo.MLP, lfed.FederatedModule, a.B, c.D, e.F, g.H, i.J)"
    short = shorten_subclass_list(text, keep=2)
    assert "lfed.models.zoo.MLP, torch.nn.Module, a.B, ... and 4 more" in short and "lfed.FederatedModule" not in short


# ----------------------------------------------------------------------------- item 13: validate/test without a config


def test_validate_and_test_a_checkpoint_without_its_config(tmp_path):
    trained = quick(tmp_path / "train", "--trainer.logger", "false", "--data.num_clients", "12", "--model.net.hidden", "[32]")
    acc = float(trained.trainer.callback_metrics["test/acc"])
    ckpt = Path(trained.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    for sub in ("validate", "test"):  # no --config: default data arguments (num_clients=100 ...) differ from the run's
        cli = quick(tmp_path / sub, "--trainer.logger", "false", "--ckpt_path", str(ckpt), sub=sub, config=None)
        assert cli.datamodule.num_clients == 12 and cli.model.layout.num_params == trained.model.layout.num_params
        assert float(cli.trainer.callback_metrics["test/acc"]) == pytest.approx(acc)
        # issue 51 item 12: the evaluation is written into the run it scores (<run>/validate/), not a new run folder
        assert Path(cli.trainer.default_root_dir) == ckpt.parent.parent / sub
    assert [p.name for p in sorted((tmp_path / "train" / "runs").glob("*/version_*"))] == ["version_0"]
    assert not list((tmp_path / "validate").glob("runs/*")) and not list((tmp_path / "test").glob("runs/*"))


def test_an_evaluation_is_seeded_as_its_run_without_lightnings_noise(tmp_path, recwarn, capsys):
    """``lfed validate --ckpt_path F`` used to print Lightning's "No seed found" and "Please add the following callbacks:
    RoundCheckpoint...": it takes the run's seed from the checkpoint, and an evaluation needs no training callbacks."""
    trained = quick(tmp_path, "--trainer.logger", "false", "--seed_everything", "7", rounds=2)
    ckpt = Path(trained.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    capsys.readouterr()
    cli = quick(tmp_path, "--trainer.logger", "false", "--ckpt_path", str(ckpt), sub="validate", config=None)
    assert cli.config["validate"]["seed_everything"] == 7
    text = capsys.readouterr().err + "\n".join(str(w.message) for w in recwarn)
    assert "No seed found" not in text and "Please add the following callbacks" not in text, text


def test_a_mismatching_checkpoint_message_does_not_speak_of_resuming():
    saved = {"data.num_clients": 10}
    with pytest.raises(ValueError) as info:
        verify_fingerprint(saved, {"data.num_clients": 100})
    assert "resum" not in str(info.value) and "does not match this configuration" in str(info.value)


# ----------------------------------------------------------------------------- item 14: noise and the progress bar


def test_a_run_prints_no_library_noise_and_counts_rounds(tmp_path):
    out = lfed_subprocess(tmp_path, "fit", "--config", str(QUICK), "--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
                          env={"WANDB_MODE": "offline"})
    text = out.stdout + out.stderr
    for noise in ("LeafSpec", "litlogger", "litmodels", "anonymous setting has no effect", "args parameter is intended"):
        assert noise not in text, text
    assert "Round" in text and "Epoch 0" not in text, text
    assert list(tmp_path.glob("runs/*/version_0/wandb/offline-run-*"))  # W&B still on by default


def test_fit_draws_the_round_bar_without_validation_bars_and_validate_keeps_its_bar(disabled_fit, tmp_path):
    root, fit = disabled_fit
    lines = (fit.stdout + fit.stderr).replace("\r", "\n").splitlines()
    rounds = [ln for ln in lines if ln.startswith("Round")]
    assert any("4/4" in ln and "test/acc=" in ln for ln in rounds), lines  # the round bar, with the evaluations' accuracy
    assert not [ln for ln in lines if "Validation" in ln or "Sanity" in ln], lines
    [ckpt] = root.glob("runs/*/version_0/checkpoints/last.ckpt")
    val = lfed_subprocess(tmp_path, "validate", "--ckpt_path", str(ckpt), env={"WANDB_MODE": "disabled"})
    assert "Validation DataLoader 0" in val.stdout + val.stderr  # lfed validate keeps its bar


# ----------------------------------------------------------------------------- private Lightning APIs lfed relies on


def test_private_lightning_apis_lfed_relies_on_still_exist():
    """lfed uses these private Lightning names (each with a comment saying why); fail loudly if one changes."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.loggers import WandbLogger

    # lfed.lightning.cli.LfedCLI._parse_ckpt_path: Lightning's CLI must still call it right after parsing.
    assert "self._parse_ckpt_path()" in inspect.getsource(LightningCLI.__init__)
    # lfed.lightning.checkpoint.RoundCheckpoint.on_validation_end: the deferred save.
    for name, params in [
        ("_should_skip_saving_checkpoint", ["self", "trainer"]),
        ("_monitor_candidates", ["self", "trainer"]),
        ("_save_topk_checkpoint", ["self", "trainer", "monitor_candidates"]),
        ("_save_last_checkpoint", ["self", "trainer", "monitor_candidates"]),
    ]:
        assert list(inspect.signature(getattr(ModelCheckpoint, name)).parameters) == params, name
    # lfed.lightning.checkpoint._validation_follows
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    assert callable(trainer.fit_loop.epoch_loop._should_check_val_fx) and hasattr(trainer.fit_loop, "_data_fetcher")
    assert list(inspect.signature(trainer.fit_loop.epoch_loop._should_check_val_fx).parameters) == ["data_fetcher"]
    # lfed.lightning.reporting.QuietWandbLogger
    assert "anonymous" in WandbLogger(offline=True)._wandb_init


def test_resuming_a_finished_run_says_so_and_shows_its_evaluations(tmp_path, capsys):
    """Issue 51 item 12: Lightning skips the training of a run that already trained every round and says only "max_steps
    reached"; lfed says nothing was trained and why, and prints the run's evaluations."""
    quick(tmp_path, "--trainer.logger", "false", rounds=4)
    capsys.readouterr()
    again = quick(tmp_path, "--trainer.logger", "false", "--ckpt_path", "last", rounds=4)
    out = capsys.readouterr().out
    assert again.trainer.global_step == 4
    assert ("lfed: the checkpoint had already trained all 4 rounds of this run; nothing was trained (give a larger "
            "--trainer.max_steps to train on)") in out
    table = out.split("lfed: evaluations of the global model", 1)[1].splitlines()
    assert table[1].split()[:2] == ["rounds", "done"] and [r.split()[0] for r in table[2:4]] == ["2", "4"]


def test_a_resume_continues_its_wandb_run(tmp_path):
    """Issue 51 item 12: a checkpoint records the id of its W&B run, and ``--ckpt_path`` gives it to the W&B logger with
    ``resume="allow"`` (every resume made a new W&B run before)."""
    from types import SimpleNamespace

    from lfed.lightning.cli_loggers import WANDB_ID_KEY
    from lfed.lightning.run_dirs import RunConfig

    class FakeWandbLogger:
        _experiment = SimpleNamespace(id="abc123")

    checkpoint: dict = {}
    RunConfig({"model": {}}).on_save_checkpoint(SimpleNamespace(loggers=[FakeWandbLogger()]), None, checkpoint)
    assert checkpoint[WANDB_ID_KEY] == "abc123"

    quick(tmp_path, "--trainer.logger", "false", rounds=2)
    [last] = tmp_path.glob("runs/*/version_0/checkpoints/last.ckpt")
    saved = torch.load(last, map_location="cpu", weights_only=False)
    saved[WANDB_ID_KEY] = "abc123"  # as a run logged to W&B writes it
    torch.save(saved, last)
    wandb = ["--trainer.logger", "lfed.lightning.reporting.QuietWandbLogger", "--trainer.logger.project", "lfed-test"]
    resumed = quick(tmp_path, *wandb, "--ckpt_path", "last", rounds=3)
    [logger] = [lg for lg in resumed.trainer.loggers if "Wandb" in type(lg).__name__]
    assert logger._wandb_init["id"] == "abc123" and logger._wandb_init["resume"] == "allow"
    fresh = quick(tmp_path / "other", *wandb, rounds=1)
    [logger] = [lg for lg in fresh.trainer.loggers if "Wandb" in type(lg).__name__]
    assert logger._wandb_init.get("id") is None  # a new run gets a new W&B run


def test_a_runs_directory_names_the_composition_that_ran(tmp_path):
    """Issue 66 item 4: fedprox_digits.yaml with --model.algorithm fedavg trains FedProx's rule under the fedavg
    preset; its run directory said fedavg-digits-*, as if it were FedAvg. It names the rule the preset does not."""
    quick(tmp_path, "--trainer.logger", "false", "--model.algorithm", "fedavg", rounds=1,
          config=REPO / "configs" / "fedprox_digits.yaml")
    assert [p.name.rsplit("-", 1)[0] for p in (tmp_path / "runs").iterdir()] == ["fedavg+Prox-digits"]


def test_a_run_on_the_users_own_data_is_not_named_after_the_default_dataset(tmp_path):
    """Issue 66 item 4: a run on data given as train/test Datasets landed in runs/fedavg-digits-*."""
    fake = {"class_path": "torchvision.datasets.FakeData",
            "init_args": {"size": 60, "image_size": [1, 8, 8], "num_classes": 10,
                          "transform": {"class_path": "torchvision.transforms.ToTensor"}}}
    cfg = tmp_path / "own.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"train": fake, "test": {**fake, "init_args": {**fake["init_args"], "size": 20}},
                                            "num_clients": 4}}))
    quick(tmp_path, "--config", str(cfg), "--trainer.logger", "false", "--model.fraction", "1.0", rounds=1)
    assert [p.name.rsplit("-", 1)[0] for p in (tmp_path / "runs").iterdir()] == ["fedavg-custom"]
