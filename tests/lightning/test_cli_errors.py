"""A mistake in the configuration is one line on stderr, ``lfed fit: error: ...``, and exit status 2.

Most runs call the console script's entry point, :func:`lfed.lightning.cli.main`, with ``sys.argv``
patched (fast); two run ``python -m lfed.lightning.cli`` as a user's terminal does (the traceback, or
not). ``run_cli`` (the Python API) keeps raising the exceptions themselves: tests/lightning/test_cli.py
and tests/lightning/test_first_hour_cli.py check that.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from lightning.pytorch import Callback

from lfed.lightning.cli import main, run_cli
from lfed.lightning.cli_errors import ConfigError, FirstStep, one_line

QUICK = REPO / "configs" / "quickstart.yaml"


def base(tmp_path: Path, sub: str = "fit") -> list[str]:
    return [sub, "--config", str(QUICK), "--trainer.max_steps", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", str(tmp_path)]


def run_main(monkeypatch, capsys, args: list[str]) -> tuple[int | str | None, str]:
    """``lfed <args>`` through :func:`lfed.lightning.cli.main`: its exit status and stderr."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("LFED_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["lfed", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main()
    return info.value.code, capsys.readouterr().err


def last_line(text: str) -> str:
    return [ln for ln in text.splitlines() if ln.strip()][-1]


def garbage_checkpoint(tmp_path: Path) -> Path:
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"this is not a checkpoint\n" * 10)
    return bad


#: (the arguments after the quickstart's, words the error line must have): one bad value each.
BAD = {
    "fraction": (["--model.fraction=0"], ["fraction", "(0, 1]", "0.0"]),
    "client_lr": (["--model.training.client_lr=-0.1"], ["client_lr", "> 0", "-0.1"]),
    "batch_size": (["--model.training.batch_size=0"], ["batch_size", ">= 1", "got 0"]),
    "rho": (["--data.rho=-1"], ["rho", "> 0", "-1"]),  # refused when the data module is made, before anything starts
    "dataset": (["--data.dataset=mnits"], ["dataset", "'mnits'", "'mnist'"]),
    "mu": (["--model.algorithm=fedprox", "--model.objective=lfed.client.objectives.Prox", "--model.objective.init_args.mu=-0.5"],
           ["mu", ">= 0", "-0.5"]),
    "num_clients": (["--data.num_clients=0"], ["num_clients", ">= 1", "got 0"]),
    "client_lr_range": (["--model.training.client_lr=1e308"], ["client_lr", "1e+308", "torch.float32", "3.4e+38"]),
    "net_inputs": (["--model.net.in_features=784"],  # issue 51 item 7: the input checked like the output, before round 0
                   ["net: does not run on the data's inputs ((1, 8, 8) per example", "2x64 and 784x200", "in_features=64"]),
    "class_path": (["--model.net", "not.a.Module"], ["model.net", "Module", "not.a.Module", "No module named 'not'"]),
    "data_dir": (["--data.dataset", "mnist", "--data.data_dir", "/nonexistent/lfed-data"],
                 ["data_dir", "/nonexistent/lfed-data", "train-images-idx3-ubyte.gz"]),
    "ckpt_path": (["--ckpt_path", "{bad}"], ["ckpt_path", "bad.ckpt", "not an lfed checkpoint"]),
    # under DP, a value the accountant cannot account for (docs/privacy.md): refused before round 0
    "dp_release": (["--model.algorithm=dp_fedavg", "--model.objective=scaffold"],
                   ["objective: SCAFFOLD's server control variate", "DP-FedAvg's ε would not hold", "objective: plain or prox"]),
    "dp_local_adaptive": (["--model.algorithm=dp_fedavg", "--model.combination=lfed.privacy.DPFedAvg",
                           "--model.combination.init_args.noise_multiplier=0", "--model.combination.init_args.local_noise=1",
                           "--model.combination.init_args.target_quantile=0.5"],
                          ["target_quantile", "clipped-or-not bit", "local DP (local_noise > 0)"]),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_value_is_one_line_naming_the_argument_and_exit_status_2(name, tmp_path, monkeypatch, capsys):
    extra, words = BAD[name]
    extra = [a.format(bad=garbage_checkpoint(tmp_path)) for a in extra]
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), *extra])
    line = last_line(err)
    assert code == 2, err
    assert line.startswith("lfed fit: error: "), err
    for word in words:
        assert word in line, (word, line)
    assert "Traceback" not in err and "usage:" not in err, err


def test_parser_errors_are_one_line_too(tmp_path, monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--model.training.client_lr", "abc"])
    assert code == 2 and err.strip() == "lfed fit: error: model.training.client_lr: expected float, got abc", err
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--model.algorithm", "fedsgd"])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert last_line(err).startswith("lfed fit: error: model.algorithm: expected one of 'fedavg'") and "got fedsgd" in err
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--optimizer", "torch.optim.Adam"])
    assert code == 2 and last_line(err).startswith("lfed fit: error: --optimizer") and "--model.server_optimizer" in err
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--model.net", "lfed.models.zoo.MLP", "--model.net.bogus", "3"])
    assert code == 2 and "model.net" in last_line(err) and "Option 'bogus' is not accepted" in last_line(err), err
    code, err = run_main(monkeypatch, capsys, ["--model.training.client_lr", "0.1"])  # no subcommand
    assert code == 2 and last_line(err).startswith("lfed: error: ") and "fit" in last_line(err), err


def test_validate_and_test_name_their_subcommand(tmp_path, monkeypatch, capsys):
    bad = garbage_checkpoint(tmp_path)
    for sub in ("validate", "test"):
        code, err = run_main(monkeypatch, capsys, [*base(tmp_path, sub)[:1], "--ckpt_path", str(bad),
                                                   "--trainer.default_root_dir", str(tmp_path)])
        assert code == 2 and last_line(err).startswith(f"lfed {sub}: error: ckpt_path: "), err
        assert "Traceback" not in err


def test_a_checkpoint_of_another_configuration_is_one_line(tmp_path, monkeypatch, capsys):
    trained = run_cli([*base(tmp_path / "a"), "--trainer.max_steps", "2", "--trainer.logger", "false"])
    ckpt = Path(trained.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path / "b"), "--trainer.max_steps", "3", "--data.num_clients", "12",
                                               "--ckpt_path", str(ckpt)])
    line = last_line(err)
    assert code == 2 and line.startswith("lfed fit: error: ") and "does not match this configuration" in line, err
    assert "data.num_clients: checkpoint 20, this run 12" in line, line  # the message's list of differences, on its line


class FailInRound(Callback):
    """Raises a ValueError in round 0 (a run's own error, not the configuration's)."""

    def on_train_batch_end(self, *args, **kwargs):
        raise ValueError("lr: a value error raised while training")


def test_an_error_once_the_first_round_started_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(sys, "argv", ["lfed", *base(tmp_path), "--trainer.callbacks+=test_cli_errors.FailInRound"])
    with pytest.raises(ValueError, match="raised while training"):
        main()


def test_first_step_notes_the_first_step_only():
    watch = FirstStep()
    assert not watch.started
    watch.on_train_batch_start(None, None, None, 0)
    assert watch.started


def test_run_cli_raises_the_error_itself(tmp_path):
    with pytest.raises(ValueError, match="fraction must be in") as info:
        run_cli([*base(tmp_path), "--model.fraction=0", "--trainer.logger", "false"])
    assert not isinstance(info.value, ConfigError)


def test_one_line_keeps_a_message_of_one_line_and_joins_the_others():
    assert one_line("fraction must be in (0, 1], got 0.0") == "fraction must be in (0, 1], got 0.0"
    assert one_line("a: first\n\n  b: second\n  c: third") == "a: first; b: second; c: third"


def lfed_terminal(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB", "LFED_DEBUG", "JSONARGPARSE"))}
    environ.update({"PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", **(env or {})})
    return subprocess.run([sys.executable, "-m", "lfed.lightning.cli", *args], cwd=tmp_path, env=environ, capture_output=True,
                          text=True, timeout=300)


def test_the_terminal_shows_one_line_and_lfed_debug_the_traceback(tmp_path):
    args = [*base(tmp_path), "--model.fraction=0"]
    plain = lfed_terminal(tmp_path, *args)
    assert plain.returncode == 2, plain.stderr
    assert last_line(plain.stderr) == "lfed fit: error: model.fraction must be in (0, 1], got 0.0"
    assert "Traceback" not in plain.stderr
    debug = lfed_terminal(tmp_path, *args, env={"LFED_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert last_line(debug.stderr) == "ValueError: fraction must be in (0, 1], got 0.0"
    parser = lfed_terminal(tmp_path, *base(tmp_path), "--model.training.client_lr", "abc", env={"LFED_DEBUG": "1"})
    assert "Traceback (most recent call last)" in parser.stderr and "model.training.client_lr" in parser.stderr


def test_a_run_that_diverges_ends_in_one_line_naming_the_round_and_the_fix(tmp_path):
    """A client_lr that overflows: exit 1 and one line (the round, the clients, "Lower client_lr"), no traceback."""
    done = lfed_terminal(tmp_path, *base(tmp_path), "--model.training.client_lr", "1e30", "--trainer.max_steps", "3")
    assert done.returncode == 1, done.stderr[-3000:]
    line = last_line(done.stderr)
    assert line.startswith("lfed fit: stopped: round 0: ") and "contain NaN or Inf" in line and "Lower client_lr" in line
    assert "Traceback" not in done.stderr


def test_max_epochs_without_max_steps_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    """An epoch is no unit of a federated run (lfed's loader would make one 1,000 rounds): refused before round 0."""
    args = [*base(tmp_path), "--trainer.max_steps", "-1", "--trainer.max_epochs", "2"]
    code, err = run_main(monkeypatch, capsys, args)
    assert code == 2
    assert last_line(err).startswith("lfed fit: error: trainer.max_epochs: a federated run counts rounds, not epochs")


def test_a_class_path_that_does_not_import_is_one_line_naming_the_setting(monkeypatch, capsys, tmp_path):
    """A user's class_path whose module is not importable (their folder not on PYTHONPATH), or a class the module lacks:
    one line naming the setting, the import error and the fix, before anything runs (issue 51 item 10)."""
    own = tmp_path / "own.yaml"
    own.write_text("model:\n  objective:\n    class_path: fedcm_not_on_the_path.FedCM\n")
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--config", str(own)])
    assert code == 2
    assert last_line(err) == (f"lfed fit: error: {own}: model.objective: class_path fedcm_not_on_the_path.FedCM: cannot import "
                              "fedcm_not_on_the_path (No module named 'fedcm_not_on_the_path'); if it is your own file, put its "
                              "folder on PYTHONPATH (PYTHONPATH=. lfed fit ...)")
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--model.objective", '{"class_path": "lfed.client.objectives.Proxx"}'])
    assert code == 2
    assert last_line(err) == "lfed fit: error: model.objective: class_path lfed.client.objectives.Proxx: lfed.client.objectives has no Proxx"


#: Issue 51 item 8: (extra arguments, the error line's start). Each is refused before anything starts.
NOT_A_ROUND = {
    "gradient_clip_val": (["--trainer.gradient_clip_val", "1.0"],
                          "lfed fit: error: trainer.gradient_clip_val: Lightning clips the gradient of one backward pass"),
    "accumulate_grad_batches": (["--trainer.accumulate_grad_batches", "2"],
                                "lfed fit: error: trainer.accumulate_grad_batches: one training step is one federated round"),
    "val_check_interval": (["--trainer.val_check_interval", "0.5"],
                           "lfed fit: error: trainer.val_check_interval: evaluate every how many rounds, an integer >= 1, got 0.5"),
    "accelerator": (["--trainer.accelerator", "gpu"], "lfed fit: error: trainer.accelerator: 'gpu' needs a CUDA device and torch "
                                                      "sees none"),
}


@pytest.mark.parametrize("name", list(NOT_A_ROUND))
def test_trainer_flags_that_cannot_apply_are_one_line_before_anything_starts(name, monkeypatch, capsys, tmp_path):
    """Lightning's flags for one backward pass (clipping, accumulation, a fraction of an epoch) and a GPU that is not
    there: one line naming the flag and what to do, exit 2, and no run folder left (not Lightning's "manual
    optimization" traceback)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a machine with a GPU
    extra, start = NOT_A_ROUND[name]
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), *extra])
    assert code == 2 and "Traceback" not in err
    assert last_line(err).startswith(start), err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("version_*"))


def test_a_yaml_file_with_a_tab_is_one_line_naming_the_file_and_the_line(monkeypatch, capsys, tmp_path):
    tab = tmp_path / "tab.yaml"
    tab.write_text("trainer:\n\tmax_steps: 2\n")
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--config", str(tab)])
    assert code == 2 and "Traceback" not in err
    assert last_line(err) == (f"lfed fit: error: --config {tab}: not valid YAML at line 2, column 1: found character '\\t' that "
                              "cannot start any token (YAML indents with spaces, never tabs)")


@pytest.mark.parametrize("text,problem", [
    ("method: grid\nparameters:\n\tmodel.seed:\n    values: [1]\n",
     "at line 3, column 1: found character '\\t' that cannot start any token (YAML indents with spaces, never tabs)"),
    ("method: grid\nparameters: {model.seed: {values: [1, 2]}\n", "at line 3, column 1: expected ',' or '}', but got '<stream end>'"),
])
def test_a_sweep_file_that_is_not_yaml_is_one_line_naming_the_file_and_the_line(monkeypatch, capsys, tmp_path, text, problem):
    """``lfed grid --sweep`` a broken YAML file: one line as for a --config file, not PyYAML's traceback (issue 66)."""
    from lfed.entry import main

    sweep = tmp_path / "broken.yaml"
    sweep.write_text(text)
    monkeypatch.setattr(sys, "argv", ["lfed", "grid", "--config", str(QUICK), "--sweep", str(sweep), "--root", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [f"lfed grid: error: sweep: {sweep}: not valid YAML {problem}"]


def test_a_folder_that_cannot_be_written_is_one_line_naming_default_root_dir(monkeypatch, capsys, tmp_path):
    """A working folder where the run's folder cannot be made (read-only; here a file stands where a folder must go,
    which stops root as well): one line naming trainer.default_root_dir, not an OSError traceback."""
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--trainer.default_root_dir", str(blocked)])
    assert code == 2 and "Traceback" not in err
    assert last_line(err).startswith(f"lfed fit: error: trainer.default_root_dir: cannot create the run's folder under {blocked} (")
    assert "--trainer.default_root_dir <a writable folder>" in last_line(err)


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(monkeypatch, capsys, tmp_path):
    """Ctrl-C during start-up (here: while the model is built, before Lightning's Trainer.fit, which handles a Ctrl-C
    itself): one line, exit 130, no run folder left, no traceback."""
    import functools

    from lfed.lightning.module import FederatedModule

    @functools.wraps(FederatedModule.__init__)  # its signature, which the parser reads
    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(FederatedModule, "__init__", interrupted)
    code, err = run_main(monkeypatch, capsys, base(tmp_path))
    assert code == 130 and "Traceback" not in err
    assert last_line(err) == "lfed fit: interrupted before the first round; no run was kept"
    assert not list((tmp_path / "runs").rglob("version_*")) if (tmp_path / "runs").exists() else True


def test_data_mistakes_are_found_before_anything_starts_and_leave_nothing(monkeypatch, capsys, tmp_path):
    """Issue 51 item 9: a partition typo (with the close match), more clients than examples and a dataset that is not
    there are found before the Trainer starts a W&B run: one line, exit 2, no runs/ folder."""
    cases = [(["--data.partition", "dirichlett"], "lfed fit: error: data.partition: 'dirichlett' is not one of ('iid', 'shards', "
              "'dirichlet', 'classes', 'natural') (did you mean 'dirichlet'?)"),
             (["--data.num_clients", "5000"], "lfed fit: error: data.num_clients: must be <= the number of examples (1438), got 5000"),
             (["--data.dataset", "mnist", "--data.data_dir", str(tmp_path / "nowhere")], "lfed fit: error: mnist: missing file(s)")]
    for extra, start in cases:
        code, err = run_main(monkeypatch, capsys, [*base(tmp_path), *extra])
        assert code == 2 and last_line(err).startswith(start), err
        assert "wandb" not in err.lower() and "GPU available" not in err  # nothing of the Trainer started
        assert not (tmp_path / "runs").exists()


def test_a_refusal_after_wandb_started_closes_its_run_and_leaves_nothing(monkeypatch, capsys, tmp_path):
    """A refusal that needs the net and the data (here the net's outputs) comes after W&B started its (offline) run:
    the W&B run is closed without its footer, lfed's line is the last, and no runs/ folder is left (W&B 0.31's
    ``finish`` has no ``quiet``: the run used to be closed only at exit, writing its files again)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
    monkeypatch.setattr(sys, "argv", ["lfed", *base(tmp_path), "--model.net.init_args.num_classes", "5"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main()
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert last_line(err).startswith("lfed fit: error: model.net: outputs shape (5,) per example"), err
    assert "wandb sync" not in err
    assert not (tmp_path / "runs").exists(), sorted(str(p) for p in (tmp_path / "runs").rglob("*"))


def test_a_key_typo_names_the_file_and_the_closest_setting(monkeypatch, capsys, tmp_path):
    """Issue 51 item 10: a key the parser does not know, in a --config file or on the command line: one line naming the
    file (when it is in one) and the closest setting."""
    typo = tmp_path / "typo.yaml"
    typo.write_text("model:\n  training:\n    client_lrr: 0.1\n")
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--config", str(typo)])
    assert code == 2
    assert last_line(err) == (f"lfed fit: error: --config {typo}: model.training.client_lrr: not a setting of lfed fit (did you "
                              "mean model.training.client_lr?); lfed fit --help lists them")
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--model.trainingg.client_lr", "0.1"])
    assert code == 2
    assert last_line(err) == ("lfed fit: error: model.trainingg.client_lr: not a setting of lfed fit (did you mean "
                              "model.training.client_lr?); lfed fit --help lists them")


def test_a_components_setting_without_its_class_names_the_classes_that_have_it(monkeypatch, capsys, tmp_path):
    """``--model.objective.mu 0.5`` on the default objective used to read "got NestedArg(key='mu', val='0.5')"."""
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--model.objective.mu", "0.5"])
    assert code == 2
    assert last_line(err) == ("lfed fit: error: model.objective.mu: a setting of the objective's class, and this command gives "
                              "no class for it (a name, or the default, takes its defaults); give the class first: --model.objective "
                              "lfed.client.objectives.Prox --model.objective.init_args.mu 0.5 (mu is a setting of "
                              "lfed.client.objectives.Prox, lfed.privacy.dp_sgd.DPSGD)")  # DP-SGD's prox option (issue 54)
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--model.sampler.nonsense", "1"])
    assert code == 2 and last_line(err).endswith("(no built-in sampler has a setting 'nonsense')")


def test_a_misspelt_name_suggests_the_closest_and_a_components_refusal_names_the_full_key(monkeypatch, capsys):
    """Issue 66 item 9: --model.algorithm fedprx listed 29 names and no suggestion; a component's own check said
    "fraction must be ..." where the command line says model.fraction."""
    code, err = run_main(monkeypatch, capsys, ["fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
                                               "--model.algorithm", "fedprx"])
    assert code == 2 and last_line(err).endswith("got fedprx (did you mean 'fedprox'?)"), err
    code, err = run_main(monkeypatch, capsys, ["fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
                                               "--model.fraction", "1.5"])
    assert code == 2 and last_line(err) == "lfed fit: error: model.fraction must be in (0, 1], got 1.5", err
