"""A Ctrl-C during ``lfed fit`` ends with one line: the round it stopped in, the checkpoint and the command that continues
from it (lfed/lightning/run_dirs.py ResumeNote; issue 66 item 6). Lightning stops the run itself (exit status 1)."""

from __future__ import annotations

import csv
import re
import shlex
import signal
import sys

import pytest
from conftest import REPO

from lfed.lightning.cli import main
from lfed.lightning.reporting import RoundTable


def _fit(monkeypatch, words: list[str]) -> int:
    monkeypatch.setattr(sys, "argv", ["lfed", *words])
    handler = signal.getsignal(signal.SIGINT)
    try:
        main()
    except SystemExit as stop:
        return stop.code or 0
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores SIGINT once it has seen one
    return 0


def _ctrl_c_after(monkeypatch, rounds: int) -> None:
    """A KeyboardInterrupt once ``rounds`` rounds are done, as a Ctrl-C in the next round would raise."""

    def interrupt(self, trainer, *args):
        if trainer.global_step == rounds:
            raise KeyboardInterrupt

    monkeypatch.setattr(RoundTable, "on_train_batch_end", interrupt, raising=False)


COMMAND = ["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--trainer.max_steps", "5", "--trainer.val_check_interval", "2",
           "--trainer.enable_progress_bar", "false"]


def test_ctrl_c_names_the_checkpoint_and_the_command_that_continues_it(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    _ctrl_c_after(monkeypatch, 3)
    assert _fit(monkeypatch, [*COMMAND, "--checkpoint_every", "2"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    m = re.fullmatch(r"lfed fit: interrupted in round 4 of 5; the last checkpoint is (runs/fedavg-digits-\w+/version_0/checkpoints/last\.ckpt) "
                     r"\(2 rounds done\); continue with: (lfed fit .*)", last)
    assert m, last
    words = shlex.split(m.group(2))
    assert words[:-2] == ["lfed", *COMMAND, "--checkpoint_every", "2"] and words[-2:] == ["--ckpt_path", m.group(1)]
    monkeypatch.setattr(RoundTable, "on_train_batch_end", lambda *a: None, raising=False)
    assert _fit(monkeypatch, words[1:]) == 0  # the command as printed continues the run to its end
    with open(tmp_path / m.group(1).split("/checkpoints/")[0] / "metrics.csv", newline="") as f:
        rounds = [int(r["rounds_done"]) for r in csv.DictReader(f)]
    assert rounds == [1, 2, 3, 4, 5]  # round 3, trained after the checkpoint, again (its row replaced), then 4 and 5


def test_ctrl_c_before_the_first_checkpoint_says_there_is_nothing_to_continue(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    _ctrl_c_after(monkeypatch, 1)
    assert _fit(monkeypatch, COMMAND) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "lfed fit: interrupted in round 2 of 5, before its first checkpoint (one every 10 rounds: --checkpoint_every): "
        "nothing to continue from; run the command again to start over")


@pytest.mark.parametrize("given", [["--ckpt_path", "old.ckpt"], ["--ckpt_path=old.ckpt"]])
def test_the_command_that_continues_replaces_a_ckpt_path_given(given, tmp_path, monkeypatch):
    from lfed.lightning.run_dirs import ResumeNote

    monkeypatch.chdir(tmp_path)
    note = ResumeNote(["fit", "--config", "c.yaml", *given, "--model.seed", "1"])
    assert note.continue_command(tmp_path / "runs" / "x" / "last.ckpt") == \
        "lfed fit --config c.yaml --model.seed 1 --ckpt_path runs/x/last.ckpt"
