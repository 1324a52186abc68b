"""lfed.lightning.grid as a user's terminal shows it (issue 51 item 13): with W&B on, each of a grid's runs is a W&B run
that prints no history of its own and no "git root does not exist" warning; the grid's own table says how they did."""

from __future__ import annotations

from conftest import REPO

from lfed.lightning.grid import run_grid


def test_a_grid_with_wandb_on_prints_no_wandb_history_per_run(tmp_path, monkeypatch, capfd):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "disabled")
    wandb.init(dir=str(tmp_path), reinit="create_new").finish()  # an earlier, disabled W&B run in this process (in CI: another test's)
    monkeypatch.setenv("WANDB_MODE", "offline")  # the grid runs by the mode it chose by, not one W&B cached
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
    monkeypatch.chdir(tmp_path)  # not a git repository: W&B's git lookup would warn here
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: g\nmethod: grid\nparameters:\n  model.training.client_lr:\n    values: [0.05, 0.1]\n")
    capfd.readouterr()  # only what the grid prints is read below
    group, directory = run_grid(["--config", str(REPO / "configs" / "quickstart.yaml"), "--sweep", str(sweep), "--root",
                                 str(tmp_path), "--trainer.max_steps=2", "--trainer.val_check_interval=2",
                                 "--trainer.enable_progress_bar=false"])
    out = capfd.readouterr()
    text = out.out + out.err
    assert len(group.members) == 2 and (directory / "summary.csv").is_file()
    assert all(list((directory / m.name).rglob("offline-run-*")) for m in group.members)  # W&B is on: a run each
    assert "Run history" not in text and "Run summary" not in text, text
    assert "git root" not in text, text
